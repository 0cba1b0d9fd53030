// Tensor construction, copies between devices, and the small conveniences tests and programs need.
#include "engine/tensor.h"

#include <atomic>
#include <map>
#include <set>
#include <cstring>
#include <limits>
#include <sstream>
#include <type_traits>

#include "engine/autograd.h"
#include "engine/cuda/runtime.h"
#include "engine/ops.h"
#include "engine/profiling.h"

namespace engine {

std::string shape_string(const Shape& shape) {
    std::ostringstream text;
    text << "(";
    for (size_t index = 0; index < shape.size(); ++index) text << (index ? "," : "") << shape[index];
    text << ")";
    return text.str();
}

int64_t shape_numel(const Shape& shape) {
    int64_t count = 1;
    for (int64_t extent : shape) count *= extent;
    return count;
}

uint64_t next_tensor_id() {
    static std::atomic<uint64_t> counter{1};
    return counter.fetch_add(1);
}

Storage::Storage(Device device, size_t bytes, MemoryCategory category)
    : bytes_(bytes), device_(device), category_(category) {
    data_ = allocate_bytes(device, bytes, category);
}

Storage::Storage(Device device, size_t bytes, MemoryCategory category, bool released)
    : bytes_(bytes), released_(released), device_(device), category_(category) {}

std::shared_ptr<Storage> Storage::released(Device device, size_t bytes, MemoryCategory category) {
    return std::shared_ptr<Storage>(new Storage(device, bytes, category, true));
}

Storage::~Storage() {
    if (!released_) deallocate_bytes(device_, data_, bytes_, category_);
}

void copy_bytes(void* destination, Device destination_device, const void* source, Device source_device,
                size_t bytes) {
    if (bytes == 0) return;
    if (destination_device == Device::cpu && source_device == Device::cpu) {
        // Host copies and memsets bypass the dispatch helpers, so they open their own profiler regions.
        if (profiling::enabled()) [[unlikely]] {
            const profiling::Region region("copy");
            std::memcpy(destination, source, bytes);
            return;
        }
        std::memcpy(destination, source, bytes);
        return;
    }
    cuda::copy(destination, destination_device, source, source_device, bytes);
}

void zero_bytes(void* destination, Device device, size_t bytes) {
    if (bytes == 0) return;
    if (device == Device::cpu) {
        if (profiling::enabled()) [[unlikely]] {
            const profiling::Region region("zero"); // the zeroed gradient buffers of backward, zero_grad
            std::memset(destination, 0, bytes);
            return;
        }
        std::memset(destination, 0, bytes);
        return;
    }
    cuda::zero(destination, bytes);
}

Tensor Tensor::empty(const Shape& shape, DType dtype, Device device, MemoryCategory category) {
    size_t bytes = dtype_size(dtype);
    for (int64_t extent : shape) {
        ENGINE_CHECK(extent >= 0, "Tensor::empty: negative extent in shape " << shape_string(shape));
        ENGINE_CHECK(!__builtin_mul_overflow(bytes, static_cast<size_t>(extent), &bytes),
                     "Tensor::empty: shape " << shape_string(shape) << " of " << dtype_name(dtype)
                                             << " overflows the addressable size");
    }
    auto impl = std::make_shared<TensorImpl>();
    impl->shape = shape;
    impl->dtype = dtype;
    impl->id = next_tensor_id();
    // pinned_host storage is host memory, so its tensor lives on the CPU.
    const Device storage_device = category == MemoryCategory::pinned_host ? Device::cpu : device;
    impl->storage = std::make_shared<Storage>(storage_device, bytes, category);
    return Tensor(std::move(impl));
}

Tensor Tensor::zeros(const Shape& shape, DType dtype, Device device, MemoryCategory category) {
    Tensor tensor = empty(shape, dtype, device, category);
    tensor.fill_zero();
    return tensor;
}

Tensor Tensor::full(const Shape& shape, double value, DType dtype, Device device, MemoryCategory category) {
    Tensor host = empty(shape, dtype, Device::cpu, category);
    const int64_t count = host.numel();
    switch (dtype) {
    case DType::f32: for (int64_t i = 0; i < count; ++i) host.data<float>()[i] = static_cast<float>(value); break;
    case DType::f64: for (int64_t i = 0; i < count; ++i) host.data<double>()[i] = value; break;
    case DType::i32: for (int64_t i = 0; i < count; ++i) host.data<int32_t>()[i] = static_cast<int32_t>(value); break;
    case DType::u8: for (int64_t i = 0; i < count; ++i) host.data<uint8_t>()[i] = static_cast<uint8_t>(value); break;
    case DType::bf16: {
        const bfloat16 rounded = to_bfloat16(static_cast<float>(value));
        for (int64_t i = 0; i < count; ++i) host.data<bfloat16>()[i] = rounded;
        break;
    }
    }
    return device == Device::cpu ? host : host.to(device, category);
}

namespace {
// Host ids to a device tensor through a pinned staging block, so the copy is asynchronous and no forward
// waits for the upload. The block goes back to the pinned pool at once: the pool orders its reuse after the
// copy (compute stream). The tensor keeps the values as its host copy.
void upload_ids(const Tensor& destination, std::shared_ptr<const std::vector<int32_t>> values) {
    const size_t bytes = destination.nbytes();
    if (bytes > 0) {
        void* staging = allocate_bytes(Device::cpu, bytes, MemoryCategory::pinned_host);
        std::memcpy(staging, values->data(), bytes);
        try {
            copy_bytes(destination.raw_data(), destination.device(), staging, Device::cpu, bytes);
        } catch (...) {
            deallocate_bytes(Device::cpu, staging, bytes, MemoryCategory::pinned_host);
            throw;
        }
        deallocate_bytes(Device::cpu, staging, bytes, MemoryCategory::pinned_host);
    }
    detail::impl_of(destination).storage->set_host_copy(std::move(values));
}
} // namespace

template <typename T>
Tensor Tensor::from_vector(const std::vector<T>& values, const Shape& shape, Device device,
                           MemoryCategory category) {
    ENGINE_CHECK(static_cast<int64_t>(values.size()) == shape_numel(shape),
                 "Tensor::from_vector: " << values.size() << " values for shape " << shape_string(shape));
    Tensor tensor = empty(shape, dtype_of<T>(), device, category);
    if constexpr (std::is_same_v<T, int32_t>) {
        if (device != Device::cpu) { // ids made from host values keep them (to_keeping_host_copy)
            upload_ids(tensor, std::make_shared<const std::vector<int32_t>>(values));
            return tensor;
        }
    }
    copy_bytes(tensor.raw_data(), tensor.device(), values.data(), Device::cpu, values.size() * sizeof(T));
    return tensor;
}
template Tensor Tensor::from_vector<float>(const std::vector<float>&, const Shape&, Device, MemoryCategory);
template Tensor Tensor::from_vector<double>(const std::vector<double>&, const Shape&, Device, MemoryCategory);
template Tensor Tensor::from_vector<int32_t>(const std::vector<int32_t>&, const Shape&, Device, MemoryCategory);
template Tensor Tensor::from_vector<bfloat16>(const std::vector<bfloat16>&, const Shape&, Device, MemoryCategory);

template <typename T>
std::vector<T> Tensor::to_vector() const {
    ENGINE_CHECK(dtype_of<T>() == dtype(), "to_vector<" << dtype_name(dtype_of<T>()) << ">() on " << describe());
    if constexpr (std::is_same_v<T, int32_t>) {
        // A view (reshape, with_rows) shares the storage and its copy: its values are the copy's first numel().
        const std::vector<int32_t>* host = impl().storage->host_copy();
        if (host != nullptr && host->size() >= static_cast<size_t>(numel()))
            return std::vector<int32_t>(host->begin(), host->begin() + numel());
    }
    std::vector<T> values(static_cast<size_t>(numel()));
    copy_bytes(values.data(), Device::cpu, raw_data(), device(), nbytes());
    return values;
}
template std::vector<float> Tensor::to_vector<float>() const;
template std::vector<double> Tensor::to_vector<double>() const;
template std::vector<int32_t> Tensor::to_vector<int32_t>() const;
template std::vector<bfloat16> Tensor::to_vector<bfloat16>() const;

int64_t Tensor::size(int64_t axis) const {
    const int64_t rank = dim();
    if (axis < 0) axis += rank;
    ENGINE_CHECK(axis >= 0 && axis < rank, "size(" << axis << ") on " << describe());
    return shape()[static_cast<size_t>(axis)];
}

double Tensor::item() const {
    ENGINE_CHECK(numel() == 1, "item() on " << describe() << ", which is not a single value");
    switch (dtype()) {
    case DType::f32: return to_vector<float>()[0];
    case DType::f64: return to_vector<double>()[0];
    case DType::i32: return to_vector<int32_t>()[0];
    case DType::u8: return to_vector<uint8_t>()[0];
    case DType::bf16: return to_float(to_vector<bfloat16>()[0]);
    }
    return 0.0;
}

void Tensor::set_requires_grad(bool requires_grad) {
    TensorImpl& self = impl();
    ENGINE_CHECK(self.is_leaf, "set_requires_grad on " << describe() << ", which is an op output, not a leaf");
    ENGINE_CHECK(!requires_grad || dtype() != DType::i32, "set_requires_grad on integer tensor " << describe());
    // Allocate first: if it fails, the tensor must not claim a gradient it has no buffer for. A bf16 leaf
    // accumulates its gradient in f32 (compute_dtype): summed over micro-batches in bf16 the small ones vanish.
    if (requires_grad && !self.grad) {
        Tensor buffer = zeros(shape(), compute_dtype(dtype()), device(), MemoryCategory::gradients);
        self.grad = buffer.impl_;
    }
    if (!requires_grad) self.grad.reset(); // frozen: nothing accumulates, so nothing is held
    self.requires_grad = requires_grad;
}

Tensor Tensor::grad() const { return Tensor(impl().grad); }

TensorImpl& detail::impl_of(const Tensor& tensor) { return tensor.impl(); }

void Tensor::share_gradient_buffer(const Tensor& owner) {
    TensorImpl& self = impl();
    const TensorImpl& source = owner.impl();
    ENGINE_CHECK(self.is_leaf && source.is_leaf && source.grad,
                 "share_gradient_buffer: " << describe() << " and " << owner.describe()
                                           << " must be leaves, the second with a gradient buffer");
    ENGINE_CHECK(shape_numel(source.grad->shape) == numel(),
                 "share_gradient_buffer: " << owner.describe() << "'s gradient does not have " << describe()
                                           << "'s element count");
    self.grad = source.grad;
    self.requires_grad = true;
}

void Tensor::set_gradient_buffer(const Tensor& buffer) {
    TensorImpl& self = impl();
    ENGINE_CHECK(self.is_leaf && (self.requires_grad || buffer.defined()),
                 "set_gradient_buffer: " << describe() << " must be a leaf that requires grad");
    if (!buffer.defined()) {
        self.grad.reset();
        return;
    }
    ENGINE_CHECK(buffer.numel() == numel() && buffer.dtype() == compute_dtype(dtype()) && buffer.device() == device(),
                 "set_gradient_buffer: " << buffer.describe() << " cannot hold the gradient of " << describe()
                                         << " (same element count, " << dtype_name(compute_dtype(dtype())) << ", "
                                         << device_name(device()) << ")");
    Tensor view = buffer.shape() == shape() ? buffer : buffer.reshape(shape());
    self.grad = view.impl_;
    self.requires_grad = true;
}

void move_storage_to(const std::vector<Tensor>& tensors, Device device, bool include_gradients,
                     std::optional<MemoryCategory> category) {
    std::vector<TensorImpl*> holders;
    for (const Tensor& tensor : tensors) {
        if (!tensor.defined()) continue;
        TensorImpl& impl = detail::impl_of(tensor);
        holders.push_back(&impl);
        if (impl.grad && include_gradients) holders.push_back(impl.grad.get());
    }
    // One new storage per old one, so views that share an allocation still share it after the move.
    std::map<const Storage*, std::shared_ptr<Storage>> moved;
    std::vector<std::pair<TensorImpl*, std::shared_ptr<Storage>>> rebinds;
    std::set<TensorImpl*> seen;
    for (TensorImpl* holder : holders) {
        if (!seen.insert(holder).second || holder->storage->device() == device) continue;
        const Storage& old = *holder->storage;
        std::shared_ptr<Storage>& target = moved[&old];
        if (!target && old.is_released()) {
            target = Storage::released(device, old.bytes(), category.value_or(old.category())); // no values to move
        } else if (!target) {
            target = std::make_shared<Storage>(device, old.bytes(), category.value_or(old.category()));
            copy_bytes(target->data(), device, old.data(), old.device(), old.bytes());
        }
        rebinds.emplace_back(holder, target);
    }
    // Allocated and copied all: now rebind, which cannot fail.
    for (auto& [holder, storage] : rebinds) holder->storage = storage;
}

void Tensor::fail_released() const {
    ENGINE_FAIL("tensor " << describe() << " holds no values here: its storage is released (ZeRO-3 keeps them as the "
                             "ranks' shards between uses); gather it first (the trainer's segment hooks, or "
                             "optim::WholeParameters outside a step)");
}

void release_storage(const std::vector<Tensor>& tensors) {
    std::map<const Storage*, std::shared_ptr<Storage>> released; // one per storage, so views stay views
    std::vector<std::pair<TensorImpl*, std::shared_ptr<Storage>>> rebinds;
    for (const Tensor& tensor : tensors) {
        if (!tensor.defined()) continue;
        TensorImpl& impl = detail::impl_of(tensor);
        const Storage& old = *impl.storage;
        if (old.is_released()) continue;
        std::shared_ptr<Storage>& target = released[&old];
        if (!target) target = Storage::released(old.device(), old.bytes(), old.category());
        rebinds.emplace_back(&impl, target);
    }
    for (auto& [holder, storage] : rebinds) holder->storage = storage;
}

void allocate_storage(const std::vector<Tensor>& tensors) {
    std::map<const Storage*, std::shared_ptr<Storage>> allocated; // one per released storage
    std::vector<std::pair<TensorImpl*, std::shared_ptr<Storage>>> rebinds;
    for (const Tensor& tensor : tensors) {
        if (!tensor.defined()) continue;
        TensorImpl& impl = detail::impl_of(tensor);
        const Storage& old = *impl.storage;
        if (!old.is_released()) continue;
        std::shared_ptr<Storage>& target = allocated[&old];
        if (!target) target = std::make_shared<Storage>(old.device(), old.bytes(), old.category());
        rebinds.emplace_back(&impl, target);
    }
    // Allocated all: now rebind, which cannot fail.
    for (auto& [holder, storage] : rebinds) holder->storage = storage;
}

void convert_storage_to(const std::vector<Tensor>& tensors, DType dtype) {
    std::vector<TensorImpl*> holders;
    for (const Tensor& tensor : tensors) {
        if (!tensor.defined()) continue;
        TensorImpl& impl = detail::impl_of(tensor);
        ENGINE_CHECK(!impl.grad, "convert_storage_to(" << dtype_name(dtype) << "): " << tensor.describe()
                                     << " has a gradient buffer, whose dtype would no longer be its own");
        holders.push_back(&impl);
    }
    // One new storage per old one, converted whole (every view over it starts at its first element).
    std::map<const Storage*, std::shared_ptr<Storage>> converted;
    for (TensorImpl* holder : holders) {
        if (holder->dtype == dtype) continue;
        const Storage& old = *holder->storage;
        std::shared_ptr<Storage>& target = converted[&old];
        if (target) continue;
        const int64_t count = static_cast<int64_t>(old.bytes() / dtype_size(holder->dtype));
        target = std::make_shared<Storage>(old.device(), static_cast<size_t>(count) * dtype_size(dtype), old.category());
        auto whole = [&](std::shared_ptr<Storage> storage, DType element) {
            auto impl = std::make_shared<TensorImpl>();
            impl->storage = std::move(storage);
            impl->shape = {count};
            impl->dtype = element;
            impl->id = next_tensor_id();
            return Tensor(std::move(impl));
        };
        convert_into(whole(target, dtype), whole(holder->storage, holder->dtype));
    }
    // Converted all: now rebind, which cannot fail.
    for (TensorImpl* holder : holders) {
        if (holder->dtype == dtype) continue;
        holder->storage = converted.at(holder->storage.get());
        holder->dtype = dtype;
    }
}

namespace {
// The compute stream waits for `copies` (and the event is dropped); if that cannot be queued, the host waits
// for the copy stream. Never throws.
void wait_or_synchronize(std::shared_ptr<cuda::StreamEvent>& copies) noexcept {
    if (!copies) return;
    try {
        copies->wait(cuda::compute_stream());
    } catch (...) {
        cuda::synchronize_copy_stream();
    }
    copies.reset();
}
} // namespace

StagedStorage::StagedStorage(const std::vector<Tensor>& tensors, Device device, MemoryCategory category,
                             bool on_copy_stream) {
    const bool asynchronous = on_copy_stream && device == Device::cuda;
    if (asynchronous) copies_done_ = std::make_shared<cuda::StreamEvent>();
    // One copy per storage, so views that share an allocation (a working copy and its rows) still share it.
    std::map<const Storage*, std::shared_ptr<Storage>> copies;
    std::vector<std::pair<Tensor, std::shared_ptr<Storage>>> staged;
    std::set<const TensorImpl*> seen;
    try {
        for (const Tensor& tensor : tensors) {
            if (!tensor.defined()) continue;
            TensorImpl& impl = detail::impl_of(tensor);
            if (!seen.insert(&impl).second) continue;
            ENGINE_CHECK(impl.storage->device() != device,
                         "StagedStorage: " << tensor.describe() << " is on " << device_name(device) << " already");
            if (impl.storage->is_released()) tensor.raw_data(); // throws, naming it: there is nothing to copy
            std::shared_ptr<Storage>& copy = copies[impl.storage.get()];
            if (!copy) {
                const Storage& source = *impl.storage;
                copy = std::make_shared<Storage>(device, source.bytes(), category);
                if (asynchronous) cuda::copy_to_device_async(copy->data(), source.data(), source.bytes(), *copies_done_);
                else copy_bytes(copy->data(), device, source.data(), source.device(), source.bytes());
            }
            staged.emplace_back(tensor, copy);
        }
        originals_.reserve(staged.size());
    } catch (...) {
        // Copies queued on the copy stream write buffers about to be freed: the compute stream (which orders
        // their reuse) waits for them first.
        wait_or_synchronize(copies_done_);
        throw;
    }
    // Every copy made: bind, which cannot fail, remembering what each tensor had.
    for (auto& [tensor, copy] : staged) {
        TensorImpl& impl = detail::impl_of(tensor);
        originals_.emplace_back(tensor, impl.storage);
        impl.storage = std::move(copy);
    }
    if (originals_.empty()) copies_done_.reset();
}

StagedStorage::StagedStorage(StagedStorage&& other) noexcept
    : originals_(std::move(other.originals_)), copies_done_(std::move(other.copies_done_)) {
    other.originals_.clear();
}

StagedStorage& StagedStorage::operator=(StagedStorage&& other) noexcept {
    if (this == &other) return *this;
    restore();
    originals_ = std::move(other.originals_);
    copies_done_ = std::move(other.copies_done_);
    other.originals_.clear();
    return *this;
}

void StagedStorage::wait() {
    if (!copies_done_) return;
    copies_done_->wait(cuda::compute_stream());
    copies_done_.reset();
}

void StagedStorage::restore() noexcept {
    // Copies never waited for (a prefetch not used) are ordered before their buffers go back to the pool.
    wait_or_synchronize(copies_done_);
    for (auto& [tensor, storage] : originals_) detail::impl_of(tensor).storage = std::move(storage);
    originals_.clear();
}

Tensor Tensor::detach() const {
    auto view = std::make_shared<TensorImpl>();
    view->storage = impl().storage;
    view->shape = shape();
    view->dtype = dtype();
    view->id = next_tensor_id();
    view->name = name();
    return Tensor(std::move(view));
}

Tensor Tensor::with_rows(int64_t rows) const {
    const TensorImpl& self = impl();
    ENGINE_CHECK(dim() >= 1 && rows >= 0, "with_rows(" << rows << ") of " << describe() << ": needs a first dimension");
    ENGINE_CHECK(self.is_leaf || !self.requires_grad,
                 "with_rows(" << rows << ") of " << describe() << ": an op output has no gradient buffer to share");
    Shape new_shape = shape();
    new_shape[0] = rows;
    const size_t bytes = static_cast<size_t>(shape_numel(new_shape)) * dtype_size(dtype());
    ENGINE_CHECK(bytes <= self.storage->bytes(), "with_rows(" << rows << ") of " << describe() << ": " << bytes
                                                              << " bytes, but the storage holds " << self.storage->bytes());
    auto view_of = [&](const TensorImpl& source) {
        auto view = std::make_shared<TensorImpl>();
        view->storage = source.storage;
        view->shape = new_shape;
        view->dtype = source.dtype;
        view->id = next_tensor_id();
        view->name = source.name;
        return view;
    };
    auto view = view_of(self);
    view->requires_grad = self.requires_grad;
    if (self.grad) {
        ENGINE_CHECK(bytes <= self.grad->storage->bytes(),
                     "with_rows(" << rows << ") of " << describe() << ": its gradient buffer is smaller");
        view->grad = view_of(*self.grad);
    }
    return Tensor(std::move(view));
}

Tensor Tensor::to(Device target, MemoryCategory category) const {
    Tensor result = empty(shape(), dtype(), target, category);
    copy_bytes(result.raw_data(), result.device(), raw_data(), device(), nbytes());
    return result;
}

Tensor Tensor::clone(MemoryCategory category) const { return to(device(), category); }

Tensor Tensor::to_keeping_host_copy(Device target, MemoryCategory category) const {
    ENGINE_CHECK(dtype() == DType::i32, "to_keeping_host_copy on " << describe() << ": only i32 ids keep a host copy");
    if (target == Device::cpu) return to(target, category); // host memory already: reading it costs nothing
    Tensor result = empty(shape(), dtype(), target, category);
    if (const std::vector<int32_t>* host = impl().storage->host_copy(); host != nullptr && device() == target) {
        copy_bytes(result.raw_data(), target, raw_data(), target, nbytes()); // device to device; the values are known
        result.impl().storage->set_host_copy(std::make_shared<const std::vector<int32_t>>(to_vector<int32_t>()));
        return result;
    }
    upload_ids(result, std::make_shared<const std::vector<int32_t>>(to_vector<int32_t>()));
    return result;
}

Tensor Tensor::reshape(const Shape& new_shape) const {
    int64_t count = 1;
    for (int64_t extent : new_shape)
        ENGINE_CHECK(extent >= 0 && !__builtin_mul_overflow(count, extent, &count),
                     "reshape of " << describe() << " to " << shape_string(new_shape) << ": invalid extent");
    ENGINE_CHECK(count == numel(),
                 "reshape of " << describe() << " to " << shape_string(new_shape) << ": element counts differ");
    auto view = std::make_shared<TensorImpl>(impl());
    view->shape = new_shape;
    // A reshape of a differentiable tensor is the same tensor for autograd: gradients route by id.
    return Tensor(std::move(view));
}

void Tensor::copy_from(const Tensor& source) {
    ENGINE_CHECK(source.shape() == shape() && source.dtype() == dtype(),
                 "copy_from: destination " << describe() << " and source " << source.describe() << " differ");
    impl().storage->set_host_copy(nullptr);
    copy_bytes(raw_data(), device(), source.raw_data(), source.device(), nbytes());
}

void Tensor::copy_rows_from(const Tensor& source, int64_t source_row, int64_t destination_row, int64_t count) {
    const auto rows_of = [](const Tensor& tensor) {
        return tensor.dim() == 0 || tensor.shape().back() == 0 ? 0 : tensor.numel() / tensor.shape().back();
    };
    ENGINE_CHECK(source.dtype() == dtype() && dim() >= 1 && source.dim() >= 1 && source.shape().back() == shape().back(),
                 "copy_rows_from: destination " << describe() << " and source " << source.describe()
                                                << " differ in dtype or row width");
    ENGINE_CHECK(count >= 0 && source_row >= 0 && destination_row >= 0 && source_row + count <= rows_of(source) &&
                     destination_row + count <= rows_of(*this),
                 "copy_rows_from: rows [" << source_row << "," << source_row + count << ") of " << source.describe()
                                          << " into rows [" << destination_row << "," << destination_row + count
                                          << ") of " << describe() << " fall outside them");
    impl().storage->set_host_copy(nullptr);
    const size_t row_bytes = static_cast<size_t>(shape().back()) * dtype_size(dtype());
    copy_bytes(static_cast<char*>(raw_data()) + static_cast<size_t>(destination_row) * row_bytes, device(),
               static_cast<const char*>(source.raw_data()) + static_cast<size_t>(source_row) * row_bytes,
               source.device(), static_cast<size_t>(count) * row_bytes);
}

void Tensor::fill_zero() {
    impl().storage->set_host_copy(nullptr);
    zero_bytes(raw_data(), device(), nbytes());
}

std::string Tensor::describe() const {
    if (!impl_) return "<undefined>";
    std::ostringstream text;
    if (!impl_->name.empty()) text << impl_->name << " ";
    text << shape_string(impl_->shape) << " " << dtype_name(impl_->dtype) << " " << device_name(device());
    return text.str();
}

} // namespace engine
