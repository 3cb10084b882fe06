// Reading and writing safetensors checkpoints, treated as hostile input.
//
// Format: 8-byte little-endian header length N, N bytes of UTF-8 JSON mapping tensor name →
// {"dtype", "shape", "data_offsets": [begin, end)} (offsets relative to the byte after the header),
// an optional "__metadata__" object of string → string, then the data.
//
// Every field is validated before it is used: header length against the file size and a hard cap,
// JSON syntax and UTF-8, dtype, shape (non-negative, product without overflow), byte size equal to
// shape × element size, offsets inside the data region, and no two tensors overlapping. Each error
// names the file and, where there is one, the tensor. No allocation is sized by an unchecked field.
// Codes: NOT_FOUND for a missing file, shard or tensor; DATA_LOSS when the file is shorter than its
// header says (truncated file or header, tensor data past the end); INVALID_ARGUMENT for anything
// malformed or unsupported. Tensor data need not be aligned, and gaps between tensors are accepted.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "absl/status/statusor.h"
#include "common/tensor/dtype.h"

namespace tandem {

// A read-only memory mapping of a whole file. Non-copyable; unmaps on destruction.
class MappedFile {
 public:
  static absl::StatusOr<std::unique_ptr<MappedFile>> Open(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const std::byte* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, const std::byte* data, size_t size)
      : path_(std::move(path)), data_(data), size_(size) {}
  std::string path_;
  const std::byte* data_;
  size_t size_;
};

// A tensor inside a mapped file. `data` stays valid as long as the owning file object lives.
struct TensorView {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  const std::byte* data = nullptr;
  size_t nbytes = 0;
  std::string file;  // the path it came from, for error messages

  int64_t num_elements() const;
};

// One .safetensors file.
class SafetensorsFile {
 public:
  // Largest header accepted; real checkpoints have headers well under 10 MB.
  static constexpr uint64_t kMaxHeaderBytes = 100ull << 20;

  static absl::StatusOr<std::unique_ptr<SafetensorsFile>> Open(const std::string& path);

  const std::map<std::string, TensorView>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  const std::string& path() const { return file_->path(); }

 private:
  explicit SafetensorsFile(std::unique_ptr<MappedFile> file) : file_(std::move(file)) {}
  std::unique_ptr<MappedFile> file_;
  std::map<std::string, TensorView> tensors_;
  std::map<std::string, std::string> metadata_;
};

// A Hugging Face checkpoint directory: model.safetensors, or shards listed by
// model.safetensors.index.json ({"weight_map": {tensor: shard file}}). The index is validated too:
// shard names must be plain file names inside the directory, every listed tensor must be in its
// shard, and no tensor may appear in two shards or in a shard without being listed.
class Checkpoint {
 public:
  static absl::StatusOr<std::unique_ptr<Checkpoint>> Open(const std::string& dir);

  // All tensors by name.
  const std::map<std::string, const TensorView*>& tensors() const { return tensors_; }
  // NOT_FOUND naming the tensor and the directory when absent.
  absl::StatusOr<const TensorView*> Get(const std::string& name) const;
  const std::string& dir() const { return dir_; }

 private:
  std::string dir_;
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::map<std::string, const TensorView*> tensors_;
};

// A tensor to write: `data` holds shape-product × DTypeSize(dtype) bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::kF32;
  std::vector<int64_t> shape;
  std::vector<std::byte> data;
};

// Writes a single safetensors file (tensors in the given order, 8-byte aligned header).
absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata = {});

}  // namespace tandem
