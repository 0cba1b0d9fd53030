// Tensor: a shape, a dtype and a device over reference-counted storage, plus the autograd identity that
// the tape uses to route gradients.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "engine/dtype.h"
#include "base/error.h"
#include "engine/memory.h"

namespace engine {

using Shape = std::vector<int64_t>;
std::string shape_string(const Shape& shape);
int64_t shape_numel(const Shape& shape);

// Owns one allocation; frees it (through the accounting allocator) when the last tensor lets go.
class Storage {
public:
    Storage(Device device, size_t bytes, MemoryCategory category);
    // ZeRO-3's released storage (release_storage): no allocation, but the bytes, device and category a fresh one
    // would have (allocate_storage makes it). A tensor over it throws, naming itself, when its data is read.
    static std::shared_ptr<Storage> released(Device device, size_t bytes, MemoryCategory category);
    ~Storage();
    Storage(const Storage&) = delete;
    Storage& operator=(const Storage&) = delete;

    void* data() const { return data_; }
    size_t bytes() const { return bytes_; }
    Device device() const { return device_; }
    MemoryCategory category() const { return category_; }
    bool is_released() const { return released_; }

    // The values of an i32 device storage as the host uploaded them (Tensor::to_keeping_host_copy), so that
    // id checks and index building on the host need no device read (a synchronisation). Null when there is
    // none; dropped by every write through the Tensor API.
    const std::vector<int32_t>* host_copy() const { return host_copy_.get(); }
    void set_host_copy(std::shared_ptr<const std::vector<int32_t>> values) { host_copy_ = std::move(values); }

private:
    std::shared_ptr<const std::vector<int32_t>> host_copy_;
    Storage(Device device, size_t bytes, MemoryCategory category, bool released);
    void* data_ = nullptr;
    size_t bytes_ = 0;
    bool released_ = false;
    Device device_;
    MemoryCategory category_;
};

struct TensorImpl {
    std::shared_ptr<Storage> storage;
    Shape shape;
    DType dtype = DType::f32;
    uint64_t id = 0;             // autograd identity, unique for the process lifetime
    bool requires_grad = false;  // a leaf that wants a gradient, or an op output that depends on one
    bool is_leaf = true;         // created by the user, not by an op
    std::shared_ptr<TensorImpl> grad; // persistent gradient buffer of a leaf (allocated once)
    // Alive while any handle of this autograd id is (reshape copies it with the id): the tape frees the nodes
    // whose outputs no live tensor and no kept node can reach (Tape::release_unreachable).
    std::shared_ptr<const void> liveness = std::make_shared<char>();
    std::string name;
};

class Tensor;
namespace cuda {
class StreamEvent;
}
namespace detail {
// The engine's own access to a tensor's fields (autograd, storage): for engine/ sources only.
TensorImpl& impl_of(const Tensor& tensor);
} // namespace detail

class Tensor {
public:
    Tensor() = default;

    // Uninitialised (CPU: poisoned with NaN in debug builds is not done; callers write every element).
    static Tensor empty(const Shape& shape, DType dtype, Device device,
                        MemoryCategory category = current_memory_category());
    static Tensor zeros(const Shape& shape, DType dtype, Device device,
                        MemoryCategory category = current_memory_category());
    static Tensor full(const Shape& shape, double value, DType dtype, Device device,
                       MemoryCategory category = current_memory_category());
    template <typename T>
    static Tensor from_vector(const std::vector<T>& values, const Shape& shape, Device device,
                              MemoryCategory category = current_memory_category());

    bool defined() const { return impl_ != nullptr; }
    const Shape& shape() const { return impl().shape; }
    int64_t dim() const { return static_cast<int64_t>(impl().shape.size()); }
    int64_t size(int64_t axis) const;
    int64_t numel() const { return shape_numel(impl().shape); }
    size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype()); }
    DType dtype() const { return impl().dtype; }
    Device device() const { return impl().storage->device(); }
    MemoryCategory category() const { return impl().storage->category(); }
    uint64_t id() const { return impl().id; }
    const std::string& name() const { return impl().name; }
    void set_name(std::string name) { impl().name = std::move(name); }

    void* raw_data() const {
        const Storage& storage = *impl().storage;
        if (storage.is_released()) [[unlikely]] fail_released();
        return storage.data();
    }
    // ZeRO-3: whether this tensor's storage is released (release_storage), its values held elsewhere.
    bool storage_released() const { return impl().storage->is_released(); }
    template <typename T>
    T* data() const {
        ENGINE_CHECK(dtype_of<T>() == dtype(), "tensor " << describe() << ": data<" << dtype_name(dtype_of<T>())
                                                         << ">() on a " << dtype_name(dtype()) << " tensor");
        return static_cast<T*>(raw_data());
    }

    // Autograd.
    bool requires_grad() const { return impl().requires_grad; }
    bool is_leaf() const { return impl().is_leaf; }
    // On a leaf: true turns gradient tracking on and allocates its persistent gradient buffer once; false turns
    // it off and lets the buffer go (a frozen parameter holds none: nn::Module::set_requires_grad).
    void set_requires_grad(bool requires_grad);
    Tensor grad() const; // the persistent gradient buffer of a leaf (dtype compute_dtype(dtype())); undefined if none
    // A new tensor sharing this one's storage but with no autograd history: saved-tensor style.
    Tensor detach() const;
    // The same storage seen with `rows` rows in the first dimension, fewer or more, as long as the storage
    // holds them; a leaf's gradient buffer is shared the same way. A new autograd identity: a leaf of its own
    // whose gradient accumulates into the shared buffer. The padded vocabulary uses it: wte's (V,C) parameter
    // and the LM head's (Vp,C) view are one allocation (nn/gpt.h).
    Tensor with_rows(int64_t rows) const;

    // Copies.
    Tensor to(Device device, MemoryCategory category = current_memory_category()) const;
    Tensor clone(MemoryCategory category = current_memory_category()) const;
    // `to` for an i32 tensor of ids that also keeps their host values beside the device copy: to_vector
    // then reads them without touching the device, so the ops' id checks cost no synchronisation. Writing
    // the device memory behind the Tensor API's back (data<int32_t>() in a kernel) would leave the copy stale;
    // the engine never does, and copy_from/fill_zero drop it.
    Tensor to_keeping_host_copy(Device device, MemoryCategory category = current_memory_category()) const;
    template <typename T>
    std::vector<T> to_vector() const;
    double item() const; // a one-element float tensor's value, as double
    // Same storage, new shape with the same element count.
    Tensor reshape(const Shape& shape) const;
    // Overwrites this tensor's contents with `source` (same shape and dtype; any devices).
    void copy_from(const Tensor& source);
    // Rows are the tensor seen as (numel / last dimension, last dimension), each a contiguous run of memory:
    // copies `count` rows of `source` from its row `source_row` over this tensor's rows from `destination_row`
    // (same dtype and last dimension; any devices). The tiled MLP's tiles go in and out through it
    // (checkpoint::tiled_rows).
    void copy_rows_from(const Tensor& source, int64_t source_row, int64_t destination_row, int64_t count);
    void fill_zero();

    std::string describe() const; // "name (2,3) f32 cpu"

    // Storage, as the module layer needs it (working copies, the padded table, Module::to).
    size_t storage_bytes() const { return impl().storage->bytes(); } // what the allocation holds, >= nbytes()
    bool shares_storage_with(const Tensor& other) const { return impl().storage == other.impl().storage; }
    // Whether an i32 device tensor still carries the host values it was uploaded with (to_keeping_host_copy).
    bool has_host_copy() const { return impl().storage->host_copy() != nullptr; }
    // Makes this leaf require grad with `owner`'s gradient buffer as its own, without allocating one: a bf16
    // working copy then accumulates into its f32 master's buffer. `owner` must be a leaf that requires grad.
    void share_gradient_buffer(const Tensor& owner);
    // Streamed gradients (model state off the device): makes `buffer` this leaf's gradient buffer (a tensor of its
    // element count in compute_dtype(dtype()) on its device, which the caller zeroed), or with an undefined
    // tensor takes the buffer away, leaving the leaf requiring grad with nothing to accumulate into: an op that
    // records it then fails, naming it, until a buffer is given again. Nodes recorded before keep the buffer
    // they captured. A leaf that did not require grad does once given a buffer (unfreezing a parameter whose
    // buffer is a view of a larger one: the padded table).
    void set_gradient_buffer(const Tensor& buffer);

    explicit Tensor(std::shared_ptr<TensorImpl> impl) : impl_(std::move(impl)) {}

private:
    // The autograd and storage fields are the engine's own: code outside engine/ uses the methods above.
    friend TensorImpl& detail::impl_of(const Tensor& tensor);
    [[noreturn]] void fail_released() const;
    TensorImpl& impl() const {
        ENGINE_CHECK(impl_ != nullptr, "use of an undefined tensor");
        return *impl_;
    }
    std::shared_ptr<TensorImpl> impl_;
};

// Moves every tensor's storage, and its gradient buffer's, to `device` in place: handles keep their identity
// and see the new storage, and storages shared before (a with_rows view, a working copy's gradient) are
// shared after. All new storage is allocated and filled before any is swapped in, so a failure changes
// nothing. Tensors already on `device` stay.
// include_gradients false moves the tensors' own storage only, leaving their gradient buffers where they are
// (parameter streaming parks working copies on the host while their gradients stay on the device); `category`
// replaces the storages' own (parked copies are pinned_host on the host, parameters again on the device).
void move_storage_to(const std::vector<Tensor>& tensors, Device device, bool include_gradients = true,
                     std::optional<MemoryCategory> category = std::nullopt);

// Converts every tensor's storage to `dtype` in place (rounded to nearest even into bf16): handles keep their
// identity and shapes and see the new storage in the new dtype, and storages shared before (a with_rows view)
// are shared after. For tensors without a gradient buffer (a frozen parameter stored in its compute dtype,
// nn::Module::set_compute_dtype); one with a buffer is refused, naming it. All new storage is allocated and
// filled before any is swapped in, so a failure changes nothing.
void convert_storage_to(const std::vector<Tensor>& tensors, DType dtype);

// ZeRO-3 (docs/DISTRIBUTED.md, "Stage 3"): tensors whose values live as ranks' shards between their uses.
// release_storage binds every tensor to released storage (one per storage shared before, so views stay views),
// whose memory goes once nothing else (a recorded node's saved tensor) holds the old one; reading a released
// tensor's data then throws, naming it. allocate_storage binds every released one to fresh storage of the bytes it
// had, in its category, uninitialised (the caller writes it), again one per storage shared before; all are
// allocated before any is bound, so a failure changes nothing. Gradient buffers are not touched; tensors already
// released (or not) are left as they are.
void release_storage(const std::vector<Tensor>& tensors);
void allocate_storage(const std::vector<Tensor>& tensors);

// Parameter streaming (docs/MEMORY.md, "Parameters streamed"): for one use, tensors see a copy of their
// storage on another device. The constructor binds every tensor to a fresh copy of its storage on `device`
// (in `category`)
// (storages shared before are shared after; gradient buffers stay where they are; all copies are made before
// any is bound, so a failure changes nothing); restore() binds them back to the storage they had, which the
// copies never wrote, and drops the copies: their memory is freed once no saved tensor of a recorded node
// holds them. The destructor restores. Writes into the copies are lost: they are for reading (a forward).
class StagedStorage {
public:
    StagedStorage() = default;
    // on_copy_stream (a CUDA `device`, pinned sources): the copies go on the copy stream and this returns at once;
    // wait() orders the compute stream after them, and must come before anything reads the tensors.
    StagedStorage(const std::vector<Tensor>& tensors, Device device, MemoryCategory category,
                  bool on_copy_stream = false);
    ~StagedStorage() { restore(); }
    StagedStorage(StagedStorage&& other) noexcept;
    StagedStorage& operator=(StagedStorage&& other) noexcept;
    StagedStorage(const StagedStorage&) = delete;
    StagedStorage& operator=(const StagedStorage&) = delete;
    void wait(); // nothing when the copies were synchronous or are waited for already
    void restore() noexcept;
    bool active() const { return !originals_.empty(); }

private:
    std::vector<std::pair<Tensor, std::shared_ptr<Storage>>> originals_; // each tensor and the storage it had
    std::shared_ptr<cuda::StreamEvent> copies_done_; // on_copy_stream's, until wait()
};

uint64_t next_tensor_id();

// Copies raw bytes between any two devices. Host destinations are complete on return; device-to-device
// and host-to-device copies are ordered on the compute stream.
void copy_bytes(void* destination, Device destination_device, const void* source, Device source_device,
                size_t bytes);
void zero_bytes(void* destination, Device device, size_t bytes);

} // namespace engine
