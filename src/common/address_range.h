// address_range.h: a half-open device address range and a sorted set of disjoint ranges.
//
// Every live-set that tracks reserved memory (the trace's own state, the capture's final-state
// synthesis, the replayer's reserved ranges) is a set of address ranges; this is their one type.
//
// AddressRange invariants (checked by make(), the only way to build one from outside data):
//   * non-empty: begin < end;
//   * no overflow: end = begin + size is computed with checked arithmetic, so a range never wraps
//     past the top of the 64-bit address space (the top byte 2^64-1 is never inside a range).
//
// RangeSet invariants (kept by every member function):
//   * the ranges are sorted by begin and pairwise disjoint (no byte is in two ranges);
//   * with Touching::Merge, two ranges never touch either (a.end == b.begin is merged into one),
//     so equal sets of bytes give equal sets; with Touching::Keep, touching ranges stay apart
//     (two cudaMalloc segments that happen to be adjacent are still two segments);
//   * bytes() is the exact sum of the range sizes (disjoint ranges below 2^64 cannot overflow it);
//   * find / insert / erase / clip are O(log n) plus the number of ranges they remove or split.
#pragma once

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <optional>
#include <vector>

namespace memforensics {

struct AddressRange {
  uint64_t begin = 0;
  uint64_t end = 0;  // exclusive

  // [addr, addr + size), or nothing when size is 0 or addr + size does not fit in 64 bits.
  static constexpr std::optional<AddressRange> make(uint64_t addr, uint64_t size) {
    uint64_t end = 0;
    if (size == 0 || __builtin_add_overflow(addr, size, &end)) return std::nullopt;
    return AddressRange{addr, end};
  }
  // [begin, end), or nothing when end <= begin.
  static constexpr std::optional<AddressRange> between(uint64_t begin, uint64_t end) {
    if (end <= begin) return std::nullopt;
    return AddressRange{begin, end};
  }

  constexpr uint64_t size() const { return end - begin; }
  constexpr bool contains(uint64_t addr) const { return addr >= begin && addr < end; }
  constexpr bool contains(const AddressRange& r) const { return r.begin >= begin && r.end <= end; }
  constexpr bool overlaps(const AddressRange& r) const { return r.begin < end && begin < r.end; }
  friend constexpr bool operator==(const AddressRange&, const AddressRange&) = default;
};

class RangeSet {
 public:
  enum class Touching : uint8_t { Merge, Keep };

  explicit RangeSet(Touching touching = Touching::Merge) : touching_(touching) {}

  size_t size() const { return ranges_.size(); }
  bool empty() const { return ranges_.empty(); }
  uint64_t bytes() const { return bytes_; }
  Touching touching() const { return touching_; }

  // The range holding `addr`, if any.
  std::optional<AddressRange> find(uint64_t addr) const {
    auto it = ranges_.upper_bound(addr);
    if (it == ranges_.begin()) return std::nullopt;
    --it;
    if (addr >= it->second) return std::nullopt;
    return AddressRange{it->first, it->second};
  }
  bool contains(uint64_t addr) const { return find(addr).has_value(); }

  // The first range that begins at or after `addr`, if any.
  std::optional<AddressRange> firstFrom(uint64_t addr) const {
    auto it = ranges_.lower_bound(addr);
    if (it == ranges_.end()) return std::nullopt;
    return AddressRange{it->first, it->second};
  }

  // Does any byte of r lie in the set?
  bool overlaps(const AddressRange& r) const {
    auto it = ranges_.lower_bound(r.begin);
    if (it != ranges_.end() && it->first < r.end) return true;
    return it != ranges_.begin() && std::prev(it)->second > r.begin;
  }

  // Adds r when no byte of it is in the set yet (true); otherwise changes nothing (false).
  bool insert(const AddressRange& r) {
    if (overlaps(r)) return false;
    AddressRange m = r;
    if (touching_ == Touching::Merge) {
      auto next = ranges_.find(r.end);
      if (next != ranges_.end()) {
        m.end = next->second;
        ranges_.erase(next);
      }
      auto it = ranges_.lower_bound(r.begin);
      if (it != ranges_.begin() && std::prev(it)->second == r.begin) {
        --it;
        it->second = m.end;
        bytes_ += r.size();
        return true;
      }
    }
    ranges_.emplace(m.begin, m.end);
    bytes_ += r.size();
    return true;
  }

  // Adds r, first removing whatever part of the set it overlaps (a range recorded twice counts
  // once). Returns the bytes that were already in the set.
  uint64_t assign(const AddressRange& r) {
    const uint64_t had = clip(r);
    insert(r);
    return had;
  }

  // Removes r when it lies inside one range of the set (true), splitting that range; otherwise
  // changes nothing (false).
  bool erase(const AddressRange& r) {
    auto it = ranges_.upper_bound(r.begin);
    if (it == ranges_.begin()) return false;
    --it;
    if (r.end > it->second) return false;
    const uint64_t b = it->first, e = it->second;
    ranges_.erase(it);
    if (b < r.begin) ranges_.emplace(b, r.begin);
    if (r.end < e) ranges_.emplace(r.end, e);
    bytes_ -= r.size();
    return true;
  }

  // Removes every byte of r from the set, splitting ranges that straddle its ends. Returns the
  // bytes removed.
  uint64_t clip(const AddressRange& r) {
    uint64_t removed = 0;
    auto it = ranges_.upper_bound(r.begin);
    if (it != ranges_.begin() && std::prev(it)->second > r.begin) --it;
    while (it != ranges_.end() && it->first < r.end) {
      const uint64_t b = it->first, e = it->second;
      it = ranges_.erase(it);
      if (b < r.begin) ranges_.emplace(b, r.begin);
      if (e > r.end) {
        ranges_.emplace(r.end, e);
        removed += r.end - std::max(b, r.begin);
        break;
      }
      removed += e - std::max(b, r.begin);
    }
    bytes_ -= removed;
    return removed;
  }

  void clear() {
    ranges_.clear();
    bytes_ = 0;
  }

  // In address order.
  class const_iterator {
   public:
    using iterator_category = std::bidirectional_iterator_tag;
    using value_type = AddressRange;
    using difference_type = std::ptrdiff_t;
    using pointer = void;
    using reference = AddressRange;
    const_iterator() = default;
    explicit const_iterator(std::map<uint64_t, uint64_t>::const_iterator it) : it_(it) {}
    AddressRange operator*() const { return AddressRange{it_->first, it_->second}; }
    const_iterator& operator++() {
      ++it_;
      return *this;
    }
    const_iterator operator++(int) {
      auto t = *this;
      ++it_;
      return t;
    }
    const_iterator& operator--() {
      --it_;
      return *this;
    }
    friend bool operator==(const const_iterator&, const const_iterator&) = default;

   private:
    std::map<uint64_t, uint64_t>::const_iterator it_;
  };
  const_iterator begin() const { return const_iterator(ranges_.begin()); }
  const_iterator end() const { return const_iterator(ranges_.end()); }
  std::vector<AddressRange> ranges() const { return {begin(), end()}; }

  friend bool operator==(const RangeSet& a, const RangeSet& b) {
    return a.bytes_ == b.bytes_ && a.ranges_ == b.ranges_;
  }

 private:
  std::map<uint64_t, uint64_t> ranges_;  // begin -> end
  uint64_t bytes_ = 0;
  Touching touching_;
};

}  // namespace memforensics
