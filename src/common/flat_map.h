// flat_map.h: an open-addressing hash map from uint64 keys (device addresses) to small values.
//
// Replay does one lookup per trace event, so this map is on the hot path. Linear probing over a
// power-of-two table, deletion by backward shift (no tombstones), so lookups never slow down as
// addresses are reused. The all-ones key is stored out of band, so every uint64 is a valid key.
#pragma once

#include <cstddef>
#include <cstdint>
#include <utility>
#include <vector>

namespace memforensics {

template <typename V>
class U64Map {
 public:
  U64Map() { rehash(16); }

  size_t size() const { return size_ + (has_special_ ? 1 : 0); }
  // Slots of the table (a copy copies them all: the memory a copy costs).
  size_t capacity() const { return table_.size(); }
  bool empty() const { return size() == 0; }

  V* find(uint64_t key) {
    if (key == kEmpty) return has_special_ ? &special_ : nullptr;
    size_t i = slot(key);
    while (true) {
      Entry& e = table_[i];
      if (e.key == key) return &e.value;
      if (e.key == kEmpty) return nullptr;
      i = (i + 1) & mask_;
    }
  }
  const V* find(uint64_t key) const { return const_cast<U64Map*>(this)->find(key); }

  // Inserts or overwrites; returns true when the key was new.
  bool insert(uint64_t key, const V& value) {
    if (key == kEmpty) {
      bool fresh = !has_special_;
      has_special_ = true;
      special_ = value;
      return fresh;
    }
    if ((size_ + 1) * 4 > table_.size() * 3) rehash(table_.size() * 2);
    size_t i = slot(key);
    while (true) {
      Entry& e = table_[i];
      if (e.key == key) {
        e.value = value;
        return false;
      }
      if (e.key == kEmpty) {
        e.key = key;
        e.value = value;
        ++size_;
        return true;
      }
      i = (i + 1) & mask_;
    }
  }

  // Finds `key`, or inserts it with a value-initialized V: {its value, true when it was inserted}.
  // One probe where find() then insert() take two; the table ends exactly as find() followed, when
  // the key is absent, by insert() leaves it (same growth points, same slots, same forEach order).
  // The pointer is valid until the next insertion or erasure.
  std::pair<V*, bool> tryEmplace(uint64_t key) {
    if (key == kEmpty) {
      if (has_special_) return {&special_, false};
      has_special_ = true;
      special_ = V{};
      return {&special_, true};
    }
    size_t i = slot(key);
    while (true) {
      Entry& e = table_[i];
      if (e.key == key) return {&e.value, false};
      if (e.key == kEmpty) break;
      i = (i + 1) & mask_;
    }
    if ((size_ + 1) * 4 > table_.size() * 3) {
      rehash(table_.size() * 2);
      i = slot(key);
      while (table_[i].key != kEmpty) i = (i + 1) & mask_;
    }
    table_[i].key = key;
    table_[i].value = V{};
    ++size_;
    return {&table_[i].value, true};
  }

  bool erase(uint64_t key) {
    if (key == kEmpty) {
      bool had = has_special_;
      has_special_ = false;
      return had;
    }
    const size_t i = probe(key);
    if (i == kNone) return false;
    eraseSlot(i);
    return true;
  }

  // Removes `key`, copying its value into *out first: one probe where find() then erase() take
  // two. false, and *out untouched, when the key is absent. The table ends as erase() leaves it.
  bool take(uint64_t key, V* out) {
    if (key == kEmpty) {
      if (!has_special_) return false;
      *out = special_;
      has_special_ = false;
      return true;
    }
    const size_t i = probe(key);
    if (i == kNone) return false;
    *out = table_[i].value;
    eraseSlot(i);
    return true;
  }

  template <typename F>
  void forEach(F&& f) const {
    for (const Entry& e : table_) {
      if (e.key != kEmpty) f(e.key, e.value);
    }
    if (has_special_) f(kEmpty, special_);
  }

  void clear() {
    for (Entry& e : table_) e.key = kEmpty;
    size_ = 0;
    has_special_ = false;
  }

 private:
  static constexpr uint64_t kEmpty = ~uint64_t{0};
  struct Entry {
    uint64_t key = kEmpty;
    V value{};
  };
  static constexpr size_t kNone = ~size_t{0};
  // The slot holding `key` (not kEmpty), or kNone.
  size_t probe(uint64_t key) const {
    size_t i = slot(key);
    while (true) {
      if (table_[i].key == key) return i;
      if (table_[i].key == kEmpty) return kNone;
      i = (i + 1) & mask_;
    }
  }
  // Backward-shift deletion of the entry in slot i: pull later entries of the probe run into the
  // hole.
  void eraseSlot(size_t i) {
    size_t hole = i;
    size_t j = i;
    while (true) {
      j = (j + 1) & mask_;
      if (table_[j].key == kEmpty) break;
      size_t home = slot(table_[j].key);
      bool movable = hole <= j ? (home <= hole || home > j) : (home <= hole && home > j);
      if (movable) {
        table_[hole] = table_[j];
        hole = j;
      }
    }
    table_[hole].key = kEmpty;
    --size_;
  }
  size_t slot(uint64_t key) const {
    uint64_t h = key * 0x9E3779B97F4A7C15ULL;
    return static_cast<size_t>(h >> shift_);
  }
  void rehash(size_t n) {
    std::vector<Entry> old = std::move(table_);
    table_.assign(n, Entry{});
    mask_ = n - 1;
    shift_ = 64 - static_cast<unsigned>(__builtin_ctzll(n));
    size_ = 0;
    for (const Entry& e : old) {
      if (e.key != kEmpty) insert(e.key, e.value);
    }
  }

  std::vector<Entry> table_;
  size_t mask_ = 0;
  unsigned shift_ = 60;
  size_t size_ = 0;
  bool has_special_ = false;
  V special_{};
};

}  // namespace memforensics
