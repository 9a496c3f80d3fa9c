// pickle_schema.cc: the snapshot schema (pickle_machine.h, section 3): the root object the
// machine built, converted into the Snapshot model.
#include <unordered_map>

#include "format/pickle/pickle_machine.h"

namespace memforensics::format::pickle_detail {

// ---------------------------------------------------------------------------------------------
// 3. Conversion of the root object

Expected<uint64_t> Machine::getU64(const Items& dict, StrId key, const Where& where, bool required,
                                   uint64_t dflt) const {
  const Value* v = field(dict, key);
  if (v == nullptr || v->kind == VK::None) {
    if (required) {
      return Error{where.str() + ": missing key '" + std::string(snap_.strings.get(key)) + "'", -1};
    }
    return dflt;
  }
  if (v->kind == VK::Int && v->i < 0) {
    return Error{where.str() + "." + std::string(snap_.strings.get(key)) + " is negative (" +
                     std::to_string(v->i) + ")",
                 -1};
  }
  if (v->kind == VK::BigInt) {
    return Error{where.str() + "." + std::string(snap_.strings.get(key)) +
                     " is an int out of the 64-bit range (at most 2^64-1)",
                 -1};
  }
  if (v->kind != VK::Int && v->kind != VK::UInt) {
    return Error{where.str() + "." + std::string(snap_.strings.get(key)) + " is " +
                     aKind(*v, nodes_) + ", expected a non-negative int",
                 -1};
  }
  return static_cast<uint64_t>(v->i);
}

Expected<int64_t> Machine::getI64(const Items& dict, StrId key, const Where& where, bool required,
                                  int64_t dflt) const {
  const Value* v = field(dict, key);
  if (v == nullptr || v->kind == VK::None) {
    if (required) {
      return Error{where.str() + ": missing key '" + std::string(snap_.strings.get(key)) + "'", -1};
    }
    return dflt;
  }
  if (v->kind == VK::UInt || v->kind == VK::BigInt) {
    return Error{where.str() + "." + std::string(snap_.strings.get(key)) +
                     " is an int out of the signed 64-bit range",
                 -1};
  }
  if (v->kind != VK::Int) {
    return Error{where.str() + "." + std::string(snap_.strings.get(key)) + " is " +
                     aKind(*v, nodes_) + ", expected an int",
                 -1};
  }
  return v->i;
}

Status Machine::convert(const Value& root) {
  if (asNode(root, NK::List) != nullptr) {
    snap_.traits.top_level_list = true;
    return convertSegments(root, "segments");
  }
  const Items* top = asNode(root, NK::Dict);
  if (top == nullptr) {
    return Error{std::string("the pickle holds ") + aKind(root, nodes_) +
                     ", expected a snapshot dict or a list of segments",
                 -1};
  }
  const Value* segs = nullptr;
  const Value* traces = nullptr;
  for (size_t i = 0; i + 1 < top->size(); i += 2) {
    const Value& k = (*top)[i];
    const Value& v = (*top)[i + 1];
    if (k.kind != VK::Str) continue;
    if (k.id == keys_.segments)
      segs = &v;
    else if (k.id == keys_.device_traces)
      traces = &v;
    else if (k.id == keys_.allocator_settings) {
      snap_.traits.has_allocator_settings = true;
      const Items* sd = asNode(v, NK::Dict);
      Status s = chargeRecords(1 + (sd ? sd->size() / 2 : 0), "allocator_settings");
      if (!s.ok()) return s;
      s = convertSettings(v);
      if (!s.ok()) return s;
    } else if (k.id == keys_.external_annotations) {
      snap_.traits.has_annotations_key = true;
      Status s = convertAnnotations(v);
      if (!s.ok()) return s;
    } else if (k.id == keys_.host_traces) {
      snap_.traits.has_host_traces = true;
      if (const Items* n = asNode(v, NK::List)) snap_.host_trace_events = n->size();
    } else if (k.id == keys_.host_segments) {
      snap_.traits.has_host_traces = true;
    } else if (ignored_seen_.insert(k.id).second) {  // a key repeated in the dict is kept once
      snap_.ignored_keys.emplace_back(snap_.strings.get(k.id));
    }
  }
  if (segs == nullptr) return Error{"snapshot dict has no 'segments' key", -1};
  Status s = convertSegments(*segs, "segments");
  if (!s.ok()) return s;
  if (traces != nullptr) {
    snap_.traits.has_device_traces = true;
    s = convertTraces(*traces);
    if (!s.ok()) return s;
  }
  events_.clear();
  events_.shrink_to_fit();
  if (bad_time_us_ > 0) {
    snap_.load_warnings.push_back(
        std::to_string(bad_time_us_) +
        " time_us value(s) negative or beyond 2^63-1 (trace entries and annotations): read as "
        "'no time recorded'");
  }
  return Status::Ok();
}

Status Machine::convertSegments(const Value& v, const char* name) {
  const Items* list = asNode(v, NK::List);
  if (list == nullptr) {
    return Error{std::string("'") + name + "' is " + aKind(v, nodes_) + ", expected a list", -1};
  }
  for (size_t si = 0; si < list->size(); ++si) {
    const Where path{name, static_cast<int64_t>(si)};
    const Items* d = asNode((*list)[si], NK::Dict);
    if (d == nullptr) {
      return Error{
          path.str() + " is " + std::string(aKind((*list)[si], nodes_)) + ", expected a dict", -1};
    }
    Status charged = chargeRecords(1 + d->size() / 2, path.str());
    if (!charged.ok()) return charged;
    Segment seg;
    auto dev = getI64(*d, keys_.device, path, false, 0);
    if (!dev) return dev.error();
    seg.device = *dev;
    if (seg.device < 0 || seg.device > 1 << 16) {
      return Error{
          path.str() + ".device is " + std::to_string(seg.device) + ", not a device ordinal", -1};
    }
    auto addr = getU64(*d, keys_.address, path, true);
    if (!addr) return addr.error();
    seg.address = *addr;
    auto total = getU64(*d, keys_.total_size, path, true);
    if (!total) return total.error();
    seg.total_size = *total;
    for (auto [key, dst] : {std::pair{keys_.allocated_size, &seg.allocated_size},
                            std::pair{keys_.active_size, &seg.active_size},
                            std::pair{keys_.requested_size, &seg.requested_size}}) {
      auto x = getU64(*d, key, path, false, 0);
      if (!x) return x.error();
      *dst = *x;
    }
    auto stream = getI64(*d, keys_.stream, path, false, 0);
    if (!stream) return stream.error();
    seg.stream = *stream;
    if (const Value* t = field(*d, keys_.segment_type); t && t->kind == VK::Str) {
      seg.segment_type = t->id;
      seg.is_large = t->id != keys_.small;
    }
    if (const Value* e = field(*d, keys_.is_expandable); e && e->kind == VK::Bool) {
      seg.is_expandable = e->i != 0;
    }
    if (const Value* pool = field(*d, keys_.segment_pool_id)) {
      snap_.traits.has_segment_pool_id = true;
      const Items* t = asNode(*pool, NK::Tuple);
      if (t == nullptr) t = asNode(*pool, NK::List);  // the JSON form has no tuples
      if (t && t->size() == 2 && (*t)[0].kind == VK::Int && (*t)[1].kind == VK::Int) {
        seg.pool_a = static_cast<uint64_t>((*t)[0].i);
        seg.pool_b = static_cast<uint64_t>((*t)[1].i);
      }
    }
    if (const Value* f = field(*d, keys_.frames)) {
      auto st = stackOf(*f, path);
      if (!st) return Error{st.error().message, -1};
      seg.stack = *st;
    }
    const Value* bv = field(*d, keys_.blocks);
    const Items* blocks = bv ? asNode(*bv, NK::List) : nullptr;
    if (blocks == nullptr) return Error{path.str() + ": missing or malformed 'blocks' list", -1};
    seg.first_block = static_cast<uint32_t>(snap_.blocks.size());
    uint64_t cursor = seg.address;
    uint64_t covered = 0;
    for (size_t bi = 0; bi < blocks->size(); ++bi) {
      const Where bpath{name, static_cast<int64_t>(si), static_cast<int64_t>(bi)};
      const Items* bd = asNode((*blocks)[bi], NK::Dict);
      if (bd == nullptr) return Error{bpath.str() + " is not a dict", -1};
      Status bcharged = chargeRecords(1 + bd->size() / 2, bpath.str());
      if (!bcharged.ok()) return bcharged;
      Block b;
      auto size = getU64(*bd, keys_.size, bpath, true);
      if (!size) return size.error();
      b.size = *size;
      if (field(*bd, keys_.address) != nullptr) {
        snap_.traits.has_block_address = true;
        auto a = getU64(*bd, keys_.address, bpath, true);
        if (!a) return a.error();
        b.address = *a;
      } else {
        b.address = cursor;  // 1.13/2.0: blocks are contiguous from the segment start
      }
      cursor = b.address + b.size;
      covered += b.size;
      if (const Value* st = field(*bd, keys_.state); st && st->kind == VK::Str) {
        if (st->id == keys_.active_allocated)
          b.state = BlockState::ActiveAllocated;
        else if (st->id == keys_.active_pending_free)
          b.state = BlockState::ActivePendingFree;
        else if (st->id == keys_.inactive)
          b.state = BlockState::Inactive;
      }
      if (field(*bd, keys_.requested_size) != nullptr) {
        auto r = getU64(*bd, keys_.requested_size, bpath, true);
        if (!r) return r.error();
        b.requested_size = *r;
        b.has_requested_size = true;
      }
      if (const Value* f = field(*bd, keys_.frames)) {
        auto st = stackOf(*f, bpath);
        if (!st) return Error{st.error().message, -1};
        b.stack = *st;
      }
      // Legacy 1.13-2.0 `history`: history[0] is the allocation that owns the block.
      if (const Value* h = field(*bd, keys_.history)) {
        snap_.traits.has_block_history = true;
        const Items* hl = asNode(*h, NK::List);
        const Items* h0 = hl && !hl->empty() ? asNode((*hl)[0], NK::Dict) : nullptr;
        if (hl != nullptr && hl->size() > 1)
          snap_.not_kept.legacy_history_entries += hl->size() - 1;
        if (h0 != nullptr) {
          // The writer derives history[0] from the block: an addr or real_size that differs from
          // the block's address or requested_size (its own key) is not kept.
          const auto differs = [&](StrId key, uint64_t block_value) {
            const Value* v = field(*h0, key);
            return v != nullptr && (v->kind == VK::Int || v->kind == VK::UInt) &&
                   static_cast<uint64_t>(v->i) != block_value;
          };
          if (differs(keys_.addr, b.address) ||
              (b.has_requested_size && differs(keys_.real_size, b.requested_size))) {
            ++snap_.not_kept.legacy_history_firsts;
          }
          Status hcharged = chargeRecords(h0->size() / 2, bpath.str() + ".history[0]");
          if (!hcharged.ok()) return hcharged;
          if (b.stack == kNoStack) {
            if (const Value* f = field(*h0, keys_.frames)) {
              auto st = stackOf(*f, Where{name, bpath.seg, bpath.block, ".history[0]"});
              if (!st) return Error{st.error().message, -1};
              b.stack = *st;
            }
          }
          if (!b.has_requested_size && field(*h0, keys_.real_size) != nullptr) {
            auto r = getU64(*h0, keys_.real_size,
                            Where{name, bpath.seg, bpath.block, ".history[0]"}, true);
            if (!r) return r.error();
            b.requested_size = *r;
            b.has_requested_size = true;
          }
        }
      }
      if (!b.has_requested_size && b.isActive()) b.requested_size = b.size;
      snap_.blocks.push_back(b);
    }
    seg.block_count = static_cast<uint32_t>(blocks->size());
    if (covered != seg.total_size && seg.block_count > 0) {
      return Error{path.str() + ": blocks cover " + std::to_string(covered) +
                       " bytes but total_size is " + std::to_string(seg.total_size),
                   -1};
    }
    snap_.segments.push_back(seg);
  }
  return Status::Ok();
}

Status Machine::convertTraces(const Value& v) {
  const Items* outer = asNode(v, NK::List);
  if (outer == nullptr) {
    return Error{std::string("'device_traces' is ") + aKind(v, nodes_) + ", expected a list", -1};
  }
  // Validate, and find out whether the lists reference events_ in file order with no sharing (what
  // every writer produces): then events_ moves into the snapshot without a copy.
  bool in_order = true;
  uint32_t expect = 0;
  for (size_t d = 0; d < outer->size(); ++d) {
    if (const EventRun* run = eventRunOf((*outer)[d])) {  // entries, in order by construction
      Status charged =
          chargeRecords(1 + uint64_t{run->count}, "device_traces[" + std::to_string(d) + "]");
      if (!charged.ok()) return charged;
      in_order = in_order && run->first == expect;
      expect += run->count;
      continue;
    }
    const Items* inner = asNode((*outer)[d], NK::List);
    if (inner == nullptr) {
      return Error{"device_traces[" + std::to_string(d) + "] is " + aKind((*outer)[d], nodes_) +
                       ", expected a list",
                   -1};
    }
    // Before the entries are looked at or copied: a list referenced from many devices counts each
    // time.
    Status charged = chargeRecords(1 + inner->size(), "device_traces[" + std::to_string(d) + "]");
    if (!charged.ok()) return charged;
    for (size_t i = 0; i < inner->size(); ++i) {
      const Value& ev = (*inner)[i];
      if (ev.kind != VK::Node || nodes_[ev.id].kind != NK::Event) {
        return Error{"device_traces[" + std::to_string(d) + "][" + std::to_string(i) + "] is " +
                         aKind(ev, nodes_) + ", expected a trace entry dict with an 'action'",
                     -1};
      }
      in_order = in_order && nodes_[ev.id].ref == expect++;
    }
  }
  in_order = in_order && expect == events_.size();
  snap_.trace_begin.assign(1, 0);
  if (in_order) {
    for (size_t d = 0; d < outer->size(); ++d) {
      const EventRun* run = eventRunOf((*outer)[d]);
      snap_.trace_begin.push_back(snap_.trace_begin.back() +
                                  (run ? run->count : asNode((*outer)[d], NK::List)->size()));
    }
    snap_.events = std::move(events_);
  } else {
    for (size_t d = 0; d < outer->size(); ++d) {
      if (const EventRun* run = eventRunOf((*outer)[d])) {
        snap_.events.insert(snap_.events.end(), events_.begin() + run->first,
                            events_.begin() + run->first + run->count);
      } else {
        for (const Value& ev : *asNode((*outer)[d], NK::List))
          snap_.events.push_back(events_[nodes_[ev.id].ref]);
      }
      snap_.trace_begin.push_back(snap_.events.size());
    }
  }
  return Status::Ok();
}

Status Machine::convertSettings(const Value& v) {
  const Items* d = asNode(v, NK::Dict);
  if (d == nullptr) return Status::Ok();  // tolerate odd settings: they are informational
  auto& s = snap_.settings;
  s.present = true;
  s.other.clear();  // a repeated allocator_settings key: the last dict counts, as in Python
  if (const Value* c = field(*d, keys_.conf); c && c->kind == VK::Str)
    s.conf = snap_.strings.get(c->id);
  if (const Value* m = field(*d, keys_.max_split_size);
      m && (m->kind == VK::Int || m->kind == VK::UInt)) {
    s.max_split_size = m->i;
  }
  if (const Value* g = field(*d, keys_.gc_threshold)) {
    if (g->kind == VK::Float)
      s.garbage_collection_threshold = g->f;
    else if (g->kind == VK::Int)
      s.garbage_collection_threshold = static_cast<double>(g->i);
  }
  if (const Value* e = field(*d, keys_.expandable_segments); e && e->kind == VK::Bool) {
    s.expandable_segments = e->i != 0;
  }
  if (field(*d, keys_.graph_capture) != nullptr) snap_.traits.has_graph_capture_key = true;
  // Keys the model does not read, kept with their scalar values for the writers (a repeated key:
  // its last value, as Python's dict holds it). Other values (lists, dicts, big ints) are dropped.
  std::unordered_map<uint32_t, size_t> other_at;  // StrId of a key -> its entry
  size_t dropped = 0;
  for (size_t i = 0; i + 1 < d->size(); i += 2) {
    const Value& k = (*d)[i];
    const Value& val = (*d)[i + 1];
    if (k.kind != VK::Str || isModelSettingsKey(snap_.strings.get(k.id))) continue;
    const size_t bytes = snap_.strings.get(k.id).size() +
                         (val.kind == VK::Str ? snap_.strings.get(val.id).size() : 0);
    if (bytes > kMaxOtherSettingBytes ||
        (!other_at.count(k.id) && s.other.size() >= kMaxOtherSettings)) {
      ++dropped;
      continue;
    }
    OtherSetting o;
    o.key = std::string(snap_.strings.get(k.id));
    switch (val.kind) {
      case VK::None:
        break;
      case VK::Bool:
        o.kind = OtherSetting::Kind::Bool;
        o.i = val.i != 0;
        break;
      case VK::Int:
        o.kind = OtherSetting::Kind::Int;
        o.i = val.i;
        break;
      case VK::UInt:
        o.kind = OtherSetting::Kind::UInt;
        o.i = val.i;
        break;
      case VK::Float:
        o.kind = OtherSetting::Kind::Float;
        o.f = val.f;
        break;
      case VK::Str:
        o.kind = OtherSetting::Kind::Str;
        o.s = std::string(snap_.strings.get(val.id));
        break;
      default: {
        NotKept& nk = snap_.not_kept;
        ++nk.settings_values;
        if (nk.settings_keys.size() < NotKept::kNamedNotKept) nk.settings_keys.push_back(o.key);
        continue;
      }
    }
    auto [at, fresh] = other_at.try_emplace(k.id, s.other.size());
    if (fresh)
      s.other.push_back(std::move(o));
    else
      s.other[at->second] = std::move(o);
  }
  if (dropped > 0) {
    snap_.load_warnings.push_back(
        std::to_string(dropped) + " allocator_settings entries not kept (at most " +
        std::to_string(kMaxOtherSettings) + " keys the model does not read, of at most " +
        std::to_string(kMaxOtherSettingBytes) + " bytes each)");
  }
  if (const Value* r = field(*d, keys_.roundup)) {
    if (const Items* rd = asNode(*r, NK::Dict)) {
      // Entries the model cannot hold (an interval that is not a power of two of MiB below 64 GiB,
      // a division that is not an integer below 2^20): counted and said, the interval left at 0.
      size_t not_kept = 0;
      for (size_t i = 0; i + 1 < rd->size(); i += 2) {
        const Value& k = (*rd)[i];
        const Value& val = (*rd)[i + 1];
        if (k.kind != VK::Str || val.kind != VK::Int) {
          ++not_kept;
          continue;
        }
        std::string_view ks = snap_.strings.get(k.id);
        uint64_t mib = 0;
        bool digits = !ks.empty() && ks.size() < 8;
        for (char ch : ks) {
          if (ch < '0' || ch > '9')
            digits = false;
          else
            mib = mib * 10 + static_cast<uint64_t>(ch - '0');
        }
        if (!digits || mib == 0 || (mib & (mib - 1)) != 0) {
          ++not_kept;
          continue;
        }
        int idx = 63 - __builtin_clzll(mib);
        if (idx < 16 && val.i >= 0 && val.i < (1 << 20)) {
          s.roundup_power2_divisions[idx] = static_cast<uint32_t>(val.i);
          s.has_roundup = true;
        } else {
          ++not_kept;
        }
      }
      if (not_kept > 0) {
        snap_.load_warnings.push_back(
            "allocator_settings: " + std::to_string(not_kept) +
            " roundup_power2_divisions entries not kept (the model holds a power of two of MiB "
            "below 64 GiB with an integer division below 2^20); the replays round those sizes as "
            "with no division");
      }
    }
  }
  return Status::Ok();
}

Status Machine::convertAnnotations(const Value& v) {
  const Items* list = asNode(v, NK::List);
  if (list == nullptr) return Status::Ok();
  Status charged = chargeRecords(list->size(), "external_annotations");
  if (!charged.ok()) return charged;
  for (const Value& item : *list) {
    const Items* d = asNode(item, NK::Dict);
    if (d == nullptr) continue;
    charged = chargeRecords(d->size() / 2, "external_annotations");
    if (!charged.ok()) return charged;
    Annotation a;
    if (const Value* x = field(*d, keys_.device); x && x->kind == VK::Int) a.device = x->i;
    if (const Value* x = field(*d, keys_.time_us);
        x && (x->kind == VK::Int || x->kind == VK::UInt)) {
      if (x->kind == VK::Int && x->i >= 0)
        a.time_us = x->i;
      else
        ++bad_time_us_;  // negative or beyond 2^63-1: no time, counted in a load warning
    }
    if (const Value* x = field(*d, keys_.name); x && x->kind == VK::Str) a.name = x->id;
    if (const Value* x = field(*d, keys_.stage); x && x->kind == VK::Str) a.stage = x->id;
    snap_.annotations.push_back(a);
  }
  return Status::Ok();
}

}  // namespace memforensics::format::pickle_detail
