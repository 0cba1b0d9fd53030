// The heap this process holds through operator new, and its high-water mark since a reset: this test binary replaces
// the global operator new and delete (heap_counter.cpp) to count them. Tensors do not pass through it (the engine's
// allocator accounts for them); what does is every std::vector, string and map the library makes.
#pragma once

#include <cstddef>

namespace engine::testing {

size_t heap_now();
size_t heap_peak();     // since the last reset_heap_peak
void reset_heap_peak(); // the peak becomes what is held now

} // namespace engine::testing
