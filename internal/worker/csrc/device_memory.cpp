// device_memory.cpp: the device allocator's view of a model's memory (CUDA:
// bytes allocated now and at peak, as torch.cuda.max_memory_allocated),
// for the per-step memory/peak_allocated_bytes. It uses the device-generic
// allocator interface of libtorch 2.10 and later, which compiles without the
// CUDA headers; older libtorch, and CPU models, report nothing (the process's
// peak RSS covers CPU).
#include "model.h"

#if ORT_TORCH_AT_LEAST(2, 10)
#include <c10/core/CachingDeviceAllocator.h>
#endif

namespace ort {

ort_device_memory_stats device_memory(const Model& m, bool reset_peak) {
  ort_device_memory_stats st{};
  if (!m.device.is_cuda()) return st;
#if ORT_TORCH_AT_LEAST(2, 10)
  auto* alloc = c10::getDeviceAllocator(m.device.type());
  const c10::DeviceIndex idx = m.device.has_index() ? m.device.index() : 0;
  const auto stats = alloc->getDeviceStats(idx);
  const auto& bytes = stats.allocated_bytes[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
  st.available = 1;
  st.allocated = bytes.current;
  st.peak_allocated = bytes.peak;
  if (reset_peak) alloc->resetPeakStats(idx);
#else
  (void)reset_peak;
#endif
  return st;
}

}  // namespace ort
