// cpu_allocator.cpp: libtorch's CPU allocator for worker processes, a cache
// of large blocks. A training step allocates and frees gigabytes of
// activation and gradient tensors of the same few hundred sizes, step after
// step. glibc hands a freed large block back to the kernel (or to another
// thread's arena), and the next step's tensor of that size comes back as
// fresh pages the kernel must fault in and zero: 180,000 minor faults and
// 1.6 s of system time per small100m step, with the mallopt settings below
// already in place (perf: half of them in OpenBLAS writing GEMM outputs).
// Cached blocks are reused without a fault: 5,000 faults and 0.4 s.
#include <c10/core/CPUAllocator.h>
#include <malloc.h>
#include <sys/mman.h>

#include <climits>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <new>
#include <unordered_map>
#include <vector>

#include "model.h"

namespace ort {
namespace {

// Blocks from this size on are cached; smaller ones (shapes, scalars) come
// from malloc's bins. Cached blocks under kMappedBytes come from malloc too
// (never handed back to it while cached), larger ones are mapped directly.
constexpr size_t kCachedBytes = size_t{4} << 10;
constexpr size_t kMappedBytes = size_t{1} << 20;
constexpr size_t kAlignment = 64;  // c10's CPU alignment (AVX-512 loads)

void* new_block(size_t size) {
  if (size < kMappedBytes) {
    void* p = nullptr;
    return posix_memalign(&p, kAlignment, size) == 0 ? p : nullptr;
  }
  void* p = mmap(nullptr, size, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  return p == MAP_FAILED ? nullptr : p;
}

void delete_block(void* p, size_t size) {
  if (size < kMappedBytes) {
    std::free(p);
  } else {
    munmap(p, size);
  }
}

// block_bytes rounds a request up to one of four sizes per power of
// two, so tensors whose shapes differ a little (a sequence a few tokens
// longer) share blocks. A tensor only touches its own bytes, so the rounding
// costs address space, not resident memory.
size_t block_bytes(size_t n) {
  const int log2 = 63 - __builtin_clzll(n - 1);
  const size_t step = size_t{1} << (log2 - 2);
  return (n + step - 1) / step * step;
}

class CachingCPUAllocator final : public c10::Allocator {
 public:
  // Both signatures: libtorch 1.x overrides the const one, 2.3+ the other.
  c10::DataPtr allocate(size_t n) const {
    void* p = take(n);
    return {p, p, &release, c10::Device(c10::DeviceType::CPU)};  // the deleter gets the context: the block itself
  }
  c10::DataPtr allocate(size_t n) { return static_cast<const CachingCPUAllocator*>(this)->allocate(n); }
  // Pure virtual from libtorch 2.3 on; a plain member before.
  void copy_data(void* dest, const void* src, size_t count) const { std::memcpy(dest, src, count); }
  c10::DeleterFnPtr raw_deleter() const override { return &release; }

  static CachingCPUAllocator& instance() {
    static auto* a = new CachingCPUAllocator();  // never destroyed: tensors may outlive static destructors
    return *a;
  }

 private:
  // The pool's bookkeeping. A request takes the smallest cached block that
  // fits it, if that is at most twice its size. Total allocated bytes (live +
  // cached) stay within 1.5x the largest live total seen so far: a miss first
  // frees cached blocks (largest first) to make room, so blocks of sizes a run
  // no longer uses do not pile up. With a limit of 1.125x, steps of one shape
  // still missed often enough for 60,000 faults per step; at 1.5x they take
  // about 5,000, and peak RSS rose by 4% (an untouched page of a block is not
  // resident).
  struct Pool {
    std::mutex mu;
    std::map<size_t, std::vector<void*>> free;  // block size -> cached blocks (never an empty list)
    std::unordered_map<void*, size_t> live;     // mapped block -> its size
    size_t live_bytes = 0, cached_bytes = 0, peak_live = 0;
  };
  mutable Pool pool_;

  void* take(size_t n) const {
    if (n == 0) return nullptr;
    if (n < kCachedBytes) {
      void* p = nullptr;
      if (posix_memalign(&p, kAlignment, n) != 0) throw std::bad_alloc();
      return p;
    }
    size_t size = block_bytes(n);
    std::lock_guard<std::mutex> lock(pool_.mu);
    void* p = nullptr;
    if (auto it = pool_.free.lower_bound(size); it != pool_.free.end() && it->first <= 2 * size) {
      size = it->first;
      p = it->second.back();
      it->second.pop_back();
      if (it->second.empty()) pool_.free.erase(it);
      pool_.cached_bytes -= size;
    } else {
      const size_t need = pool_.live_bytes + size;
      const size_t high = std::max(pool_.peak_live, need);
      const size_t limit = high + high / 2;
      while (pool_.cached_bytes > 0 && need + pool_.cached_bytes > limit) drop_largest_cached();
      if ((p = new_block(size)) == nullptr) {
        while (pool_.cached_bytes > 0) drop_largest_cached();
        if ((p = new_block(size)) == nullptr) throw std::bad_alloc();
      }
    }
    pool_.live.emplace(p, size);
    pool_.live_bytes += size;
    pool_.peak_live = std::max(pool_.peak_live, pool_.live_bytes);
    return p;
  }

  void drop_largest_cached() const {
    auto it = std::prev(pool_.free.end());  // no empty lists are kept
    delete_block(it->second.back(), it->first);
    it->second.pop_back();
    pool_.cached_bytes -= it->first;
    if (it->second.empty()) pool_.free.erase(it);
  }

  void give_back(void* p) const {
    {
      std::lock_guard<std::mutex> lock(pool_.mu);
      if (auto it = pool_.live.find(p); it != pool_.live.end()) {
        const size_t size = it->second;
        pool_.live.erase(it);
        pool_.live_bytes -= size;
        pool_.cached_bytes += size;
        pool_.free[size].push_back(p);
        return;
      }
    }
    std::free(p);  // a small block
  }

  static void release(void* p) {
    if (p != nullptr) instance().give_back(p);
  }
};

}  // namespace

void keep_freed_cpu_memory() {
  static std::once_flag once;
  std::call_once(once, [] {
    mallopt(M_MMAP_MAX, 0);              // small blocks come from the heap, where free() keeps them
    mallopt(M_TRIM_THRESHOLD, INT_MAX);  // and the heap is not shrunk after each step
    c10::SetCPUAllocator(&CachingCPUAllocator::instance(), /*priority=*/1);
  });
}

}  // namespace ort
