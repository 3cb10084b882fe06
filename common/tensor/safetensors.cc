#include "common/tensor/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstring>
#include <exception>
#include <limits>
#include <set>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "absl/status/status.h"
#include "absl/strings/escaping.h"
#include "absl/strings/str_cat.h"
#include "absl/strings/str_join.h"
#include "absl/strings/string_view.h"
#include "common/base/status_macros.h"
#include "nlohmann/json.hpp"

namespace tandem {
namespace {

using json = nlohmann::json;

constexpr absl::string_view kMetadataKey = "__metadata__";
constexpr absl::string_view kIndexFileName = "model.safetensors.index.json";
constexpr absl::string_view kSingleFileName = "model.safetensors";
// Longest name quoted in an error message; names come from hostile files and may be huge.
constexpr size_t kMaxQuotedChars = 200;
// A valid header nests three levels (header → entry → shape); anything far deeper is hostile.
constexpr int kMaxJsonDepth = 16;

// A name from a file, escaped and shortened so that it is safe to put in a message.
std::string Quote(absl::string_view s) {
  if (s.size() > kMaxQuotedChars) {
    return absl::StrCat("'", absl::CHexEscape(s.substr(0, kMaxQuotedChars)), "'... (", s.size(),
                        " bytes)");
  }
  return absl::StrCat("'", absl::CHexEscape(s), "'");
}

absl::string_view DTypeStr(DType t) {
  const std::string_view name = DTypeName(t);
  return absl::string_view(name.data(), name.size());
}

std::string TensorContext(const std::string& path, absl::string_view tensor) {
  return absl::StrCat("safetensors file '", path, "', tensor ", Quote(tensor), ": ");
}

std::string FileContext(const std::string& path) {
  return absl::StrCat("safetensors file '", path, "': ");
}

absl::Status ErrnoError(int err, absl::string_view what, const std::string& path) {
  return absl::Status(absl::ErrnoToStatusCode(err),
                      absl::StrCat(what, " '", path, "': ", std::strerror(err)));
}

// Keeps the code of `s` and puts `prefix` in front of its message.
absl::Status WithPrefix(const absl::Status& s, absl::string_view prefix) {
  return absl::Status(s.code(), absl::StrCat(prefix, s.message()));
}

// Returns the offset of the first byte that breaks strict UTF-8 (no overlong forms, no
// surrogates, nothing above U+10FFFF), or npos when `s` is valid.
size_t FindInvalidUtf8(absl::string_view s) {
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  const size_t n = s.size();
  size_t i = 0;
  while (i < n) {
    const unsigned char c = p[i];
    if (c < 0x80) {
      ++i;
      continue;
    }
    size_t len;
    unsigned char lo = 0x80, hi = 0xbf;  // bounds of the second byte
    if (c >= 0xc2 && c <= 0xdf) {
      len = 2;
    } else if (c >= 0xe0 && c <= 0xef) {
      len = 3;
      if (c == 0xe0) lo = 0xa0;
      if (c == 0xed) hi = 0x9f;
    } else if (c >= 0xf0 && c <= 0xf4) {
      len = 4;
      if (c == 0xf0) lo = 0x90;
      if (c == 0xf4) hi = 0x8f;
    } else {
      return i;
    }
    if (n - i < len) return i;
    if (p[i + 1] < lo || p[i + 1] > hi) return i;
    for (size_t k = 2; k < len; ++k) {
      if ((p[i + k] & 0xc0) != 0x80) return i;
    }
    i += len;
  }
  return absl::string_view::npos;
}

// Thrown from the parse callback; never leaves ParseJsonObject.
struct JsonRejected : std::runtime_error {
  using std::runtime_error::runtime_error;
};

// Parses `text` as a UTF-8 JSON object, rejecting duplicate keys and excessive nesting.
// `context` starts every error message.
absl::StatusOr<json> ParseJsonObject(absl::string_view text, const std::string& context) {
  if (const size_t bad = FindInvalidUtf8(text); bad != absl::string_view::npos) {
    return absl::InvalidArgumentError(
        absl::StrCat(context, "JSON is not valid UTF-8 (bad byte at offset ", bad, ")"));
  }
  // Keys seen so far in each enclosing object, innermost last.
  std::vector<std::set<std::string>> keys;
  json::parser_callback_t callback = [&keys](int depth, json::parse_event_t event,
                                             json& parsed) -> bool {
    if (depth > kMaxJsonDepth) {
      throw JsonRejected(absl::StrCat("nesting deeper than ", kMaxJsonDepth, " levels"));
    }
    switch (event) {
      case json::parse_event_t::object_start: keys.emplace_back(); break;
      case json::parse_event_t::object_end:
        if (!keys.empty()) keys.pop_back();
        break;
      case json::parse_event_t::key:
        if (!keys.empty() && parsed.is_string() &&
            !keys.back().insert(parsed.get_ref<const std::string&>()).second) {
          throw JsonRejected(
              absl::StrCat("duplicate key ", Quote(parsed.get_ref<const std::string&>())));
        }
        break;
      default: break;
    }
    return true;
  };
  json value;
  try {
    value = json::parse(text.begin(), text.end(), callback);
  } catch (const JsonRejected& e) {
    return absl::InvalidArgumentError(absl::StrCat(context, "invalid JSON: ", e.what()));
  } catch (const json::exception& e) {
    return absl::InvalidArgumentError(absl::StrCat(context, "invalid JSON: ", e.what()));
  } catch (const std::exception& e) {
    return absl::ResourceExhaustedError(absl::StrCat(context, "cannot parse JSON: ", e.what()));
  }
  if (!value.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(context, "JSON is a ", value.type_name(), ", not an object"));
  }
  return value;
}

// A JSON value that must be a non-negative integer no larger than int64 max.
absl::StatusOr<int64_t> NonNegativeInt(const json& v, absl::string_view what) {
  if (v.is_number_unsigned()) {
    const uint64_t u = v.get<uint64_t>();
    if (u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(absl::StrCat(what, " ", u, " is too large"));
    }
    return static_cast<int64_t>(u);
  }
  if (v.is_number_integer()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", v.get<int64_t>(), " is negative"));
  }
  if (v.is_number_float()) {
    return absl::InvalidArgumentError(absl::StrCat(what, " ", v.dump(), " is not an integer"));
  }
  return absl::InvalidArgumentError(
      absl::StrCat(what, " must be a non-negative integer, got a ", v.type_name()));
}

// shape product × element size, or an error when a dimension is invalid or the product overflows.
absl::StatusOr<uint64_t> ShapeBytes(const std::vector<int64_t>& shape, DType dtype) {
  uint64_t n = 1;
  for (const int64_t d : shape) {
    if (d < 0) return absl::InvalidArgumentError(absl::StrCat("dimension ", d, " is negative"));
    if (__builtin_mul_overflow(n, static_cast<uint64_t>(d), &n) ||
        n > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) {
      return absl::InvalidArgumentError(
          absl::StrCat("shape [", absl::StrJoin(shape, ", "), "] has more than 2^63 elements"));
    }
  }
  uint64_t bytes;
  if (__builtin_mul_overflow(n, static_cast<uint64_t>(DTypeSize(dtype)), &bytes)) {
    return absl::InvalidArgumentError(
        absl::StrCat("shape [", absl::StrJoin(shape, ", "), "] overflows the byte size"));
  }
  return bytes;
}

struct Extent {
  uint64_t begin;
  uint64_t end;
  const std::string* name;
};

// Validates one tensor entry of a header. `data_size` is the size of the data region.
absl::StatusOr<TensorView> ParseTensorEntry(const std::string& path, const std::string& name,
                                            const json& entry, const std::byte* data_region,
                                            uint64_t data_size, Extent* extent) {
  const std::string ctx = TensorContext(path, name);
  if (!entry.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ctx, "entry must be an object, got a ", entry.type_name()));
  }
  for (const char* field : {"dtype", "shape", "data_offsets"}) {
    if (!entry.contains(field)) {
      return absl::InvalidArgumentError(absl::StrCat(ctx, "missing field '", field, "'"));
    }
  }
  TensorView view;
  view.name = name;
  view.file = path;

  const json& dtype = entry.at("dtype");
  if (!dtype.is_string()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ctx, "field 'dtype' must be a string, got a ", dtype.type_name()));
  }
  const std::string& dtype_name = dtype.get_ref<const std::string&>();
  const std::optional<DType> parsed_dtype = ParseDType(dtype_name);
  if (!parsed_dtype) {
    return absl::InvalidArgumentError(
        absl::StrCat(ctx, "unsupported dtype ", Quote(dtype_name),
                     " (supported: F32, F16, BF16, and I8, I32, I64 for quantized checkpoints)"));
  }
  view.dtype = *parsed_dtype;

  const json& shape = entry.at("shape");
  if (!shape.is_array()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ctx, "field 'shape' must be an array, got a ", shape.type_name()));
  }
  view.shape.reserve(shape.size());
  for (const json& dim : shape) {
    absl::StatusOr<int64_t> d = NonNegativeInt(dim, "shape dimension");
    if (!d.ok()) return WithPrefix(d.status(), ctx);
    view.shape.push_back(*d);
  }
  absl::StatusOr<uint64_t> expected_bytes = ShapeBytes(view.shape, view.dtype);
  if (!expected_bytes.ok()) return WithPrefix(expected_bytes.status(), ctx);

  const json& offsets = entry.at("data_offsets");
  if (!offsets.is_array() || offsets.size() != 2) {
    return absl::InvalidArgumentError(
        absl::StrCat(ctx, "field 'data_offsets' must be an array of two integers, got ",
                     offsets.is_array() ? absl::StrCat(offsets.size(), " elements")
                                        : absl::StrCat("a ", offsets.type_name())));
  }
  absl::StatusOr<int64_t> begin = NonNegativeInt(offsets[0], "data_offsets begin");
  if (!begin.ok()) return WithPrefix(begin.status(), ctx);
  absl::StatusOr<int64_t> end = NonNegativeInt(offsets[1], "data_offsets end");
  if (!end.ok()) return WithPrefix(end.status(), ctx);
  const auto b = static_cast<uint64_t>(*begin);
  const auto e = static_cast<uint64_t>(*end);
  if (e < b) {
    return absl::InvalidArgumentError(
        absl::StrCat(ctx, "data_offsets end ", e, " is before begin ", b));
  }
  if (e > data_size) {
    return absl::DataLossError(absl::StrCat(ctx, "data_offsets [", b, ", ", e,
                                            ") out of range of the ", data_size,
                                            "-byte data region (file truncated?)"));
  }
  if (e - b != *expected_bytes) {
    return absl::InvalidArgumentError(
        absl::StrCat(ctx, "byte size mismatch: shape [", absl::StrJoin(view.shape, ", "), "] of ",
                     DTypeStr(view.dtype), " needs ", *expected_bytes, " bytes but data_offsets [",
                     b, ", ", e, ") span ", e - b));
  }
  view.data = data_region + b;
  view.nbytes = static_cast<size_t>(e - b);
  extent->begin = b;
  extent->end = e;
  return view;
}

// Rejects any two non-empty extents that share a byte. Gaps are allowed.
absl::Status CheckNoOverlap(const std::string& path, std::vector<Extent> extents) {
  std::erase_if(extents, [](const Extent& x) { return x.begin == x.end; });
  std::sort(extents.begin(), extents.end(), [](const Extent& a, const Extent& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  for (size_t i = 1; i < extents.size(); ++i) {
    const Extent& prev = extents[i - 1];
    const Extent& cur = extents[i];
    if (cur.begin < prev.end) {
      return absl::InvalidArgumentError(absl::StrCat(
          FileContext(path), "tensors ", Quote(*prev.name), " [", prev.begin, ", ", prev.end,
          ") and ", Quote(*cur.name), " [", cur.begin, ", ", cur.end, ") overlap"));
    }
  }
  return absl::OkStatus();
}

// A plain file name: no directory part, so it cannot escape the checkpoint directory by name.
// Symlinks are still followed: Hugging Face cache snapshots link every shard to a blob elsewhere.
bool IsPlainFileName(absl::string_view name) {
  return !name.empty() && name != "." && name != ".." &&
         name.find('/') == absl::string_view::npos && name.find('\0') == absl::string_view::npos;
}

// OK when `path` exists; NOT_FOUND when it does not; another error when stat fails otherwise.
absl::Status PathExists(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) == 0) return absl::OkStatus();
  return ErrnoError(errno, "cannot stat", path);
}

absl::Status WriteAll(int fd, const void* data, size_t n, const std::string& path) {
  const auto* p = static_cast<const char*>(data);
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return ErrnoError(errno, "cannot write", path);
    }
    p += w;
    n -= static_cast<size_t>(w);
  }
  return absl::OkStatus();
}

}  // namespace

// ---- MappedFile ----

absl::StatusOr<std::unique_ptr<MappedFile>> MappedFile::Open(const std::string& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return ErrnoError(errno, "cannot open", path);
  struct stat st;
  if (::fstat(fd, &st) != 0) {
    const int err = errno;
    ::close(fd);
    return ErrnoError(err, "cannot stat", path);
  }
  if (!S_ISREG(st.st_mode)) {
    ::close(fd);
    return absl::InvalidArgumentError(absl::StrCat("'", path, "' is not a regular file"));
  }
  const auto size = static_cast<size_t>(st.st_size);
  if (size == 0) {  // mmap rejects length 0; an empty file maps to no bytes.
    ::close(fd);
    return std::unique_ptr<MappedFile>(new MappedFile(path, nullptr, 0));
  }
  void* addr = ::mmap(nullptr, size, PROT_READ, MAP_PRIVATE, fd, 0);
  const int err = errno;
  ::close(fd);
  if (addr == MAP_FAILED) return ErrnoError(err, "cannot mmap", path);
  return std::unique_ptr<MappedFile>(
      new MappedFile(path, static_cast<const std::byte*>(addr), size));
}

MappedFile::~MappedFile() {
  if (data_ != nullptr && size_ > 0) ::munmap(const_cast<std::byte*>(data_), size_);
}

// ---- TensorView ----

int64_t TensorView::num_elements() const {
  int64_t n = 1;
  for (const int64_t d : shape) n *= d;
  return n;
}

// ---- SafetensorsFile ----

absl::StatusOr<std::unique_ptr<SafetensorsFile>> SafetensorsFile::Open(const std::string& path) {
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> mapped, MappedFile::Open(path));
  const std::string ctx = FileContext(path);
  const size_t size = mapped->size();
  if (size < 8) {
    return absl::DataLossError(absl::StrCat(ctx, "truncated: file is ", size,
                                            " bytes, shorter than the 8-byte header length"));
  }
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) {
    header_len = (header_len << 8) | static_cast<uint8_t>(mapped->data()[i]);
  }
  if (header_len > kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(
        ctx, "header size ", header_len, " exceeds the limit of ", kMaxHeaderBytes, " bytes"));
  }
  if (header_len > size - 8) {
    return absl::DataLossError(absl::StrCat(ctx, "truncated: header declares ", header_len,
                                            " bytes but the file has only ", size - 8,
                                            " bytes after the length"));
  }
  const absl::string_view header(reinterpret_cast<const char*>(mapped->data()) + 8, header_len);
  ASSIGN_OR_RETURN(json root, ParseJsonObject(header, ctx));

  const std::byte* data_region = mapped->data() + 8 + header_len;
  const uint64_t data_size = size - 8 - header_len;
  std::unique_ptr<SafetensorsFile> file(new SafetensorsFile(std::move(mapped)));
  std::vector<Extent> extents;
  for (const auto& [key, value] : root.items()) {
    if (key == kMetadataKey) {
      if (!value.is_object()) {
        return absl::InvalidArgumentError(absl::StrCat(
            ctx, "__metadata__ must be an object of strings, got a ", value.type_name()));
      }
      for (const auto& [mkey, mvalue] : value.items()) {
        if (!mvalue.is_string()) {
          return absl::InvalidArgumentError(absl::StrCat(ctx, "__metadata__ value for key ",
                                                         Quote(mkey), " must be a string, got a ",
                                                         mvalue.type_name()));
        }
        file->metadata_.emplace(mkey, mvalue.get<std::string>());
      }
      continue;
    }
    Extent extent{};
    ASSIGN_OR_RETURN(TensorView view,
                     ParseTensorEntry(path, key, value, data_region, data_size, &extent));
    auto [it, inserted] = file->tensors_.emplace(key, std::move(view));
    extent.name = &it->first;
    extents.push_back(extent);
  }
  RETURN_IF_ERROR(CheckNoOverlap(path, std::move(extents)));
  return file;
}

// ---- Checkpoint ----

absl::StatusOr<std::unique_ptr<Checkpoint>> Checkpoint::Open(const std::string& dir) {
  auto ckpt = std::make_unique<Checkpoint>();
  ckpt->dir_ = dir;
  const std::string index_path = absl::StrCat(dir, "/", kIndexFileName);
  const std::string single_path = absl::StrCat(dir, "/", kSingleFileName);

  const absl::Status index_exists = PathExists(index_path);
  if (!index_exists.ok() && !absl::IsNotFound(index_exists)) return index_exists;
  if (!index_exists.ok()) {
    const absl::Status single_exists = PathExists(single_path);
    if (absl::IsNotFound(single_exists)) {
      return absl::NotFoundError(absl::StrCat("checkpoint directory '", dir, "' has neither ",
                                              kSingleFileName, " nor ", kIndexFileName));
    }
    RETURN_IF_ERROR(single_exists);
    ASSIGN_OR_RETURN(std::unique_ptr<SafetensorsFile> file, SafetensorsFile::Open(single_path));
    for (const auto& [name, view] : file->tensors()) ckpt->tensors_.emplace(name, &view);
    ckpt->files_.push_back(std::move(file));
    return ckpt;
  }

  const std::string ctx = absl::StrCat("checkpoint index '", index_path, "': ");
  ASSIGN_OR_RETURN(std::unique_ptr<MappedFile> index_file, MappedFile::Open(index_path));
  if (index_file->size() > SafetensorsFile::kMaxHeaderBytes) {
    return absl::InvalidArgumentError(absl::StrCat(ctx, "size ", index_file->size(),
                                                   " exceeds the limit of ",
                                                   SafetensorsFile::kMaxHeaderBytes, " bytes"));
  }
  const absl::string_view index_text(reinterpret_cast<const char*>(index_file->data()),
                                     index_file->size());
  ASSIGN_OR_RETURN(json index, ParseJsonObject(index_text, ctx));
  if (!index.contains("weight_map")) {
    return absl::InvalidArgumentError(absl::StrCat(ctx, "missing field 'weight_map'"));
  }
  const json& weight_map = index.at("weight_map");
  if (!weight_map.is_object()) {
    return absl::InvalidArgumentError(
        absl::StrCat(ctx, "'weight_map' must be an object, got a ", weight_map.type_name()));
  }
  // tensor → shard, and the set of shards, validated before any shard is opened.
  std::map<std::string, std::string> shard_of;
  std::set<std::string> shards;
  for (const auto& [tensor, shard] : weight_map.items()) {
    if (!shard.is_string()) {
      return absl::InvalidArgumentError(absl::StrCat(
          ctx, "shard for tensor ", Quote(tensor), " must be a string, got a ", shard.type_name()));
    }
    const std::string& shard_name = shard.get_ref<const std::string&>();
    if (!IsPlainFileName(shard_name)) {
      return absl::InvalidArgumentError(absl::StrCat(ctx, "shard name ", Quote(shard_name),
                                                     " for tensor ", Quote(tensor),
                                                     " is not a plain file name in the directory"));
    }
    shard_of.emplace(tensor, shard_name);
    shards.insert(shard_name);
  }

  for (const std::string& shard_name : shards) {
    const std::string shard_path = absl::StrCat(dir, "/", shard_name);
    absl::StatusOr<std::unique_ptr<SafetensorsFile>> opened = SafetensorsFile::Open(shard_path);
    if (!opened.ok()) {
      return WithPrefix(opened.status(), absl::StrCat(ctx, "shard ", Quote(shard_name), ": "));
    }
    std::unique_ptr<SafetensorsFile> file = *std::move(opened);
    for (const auto& [name, view] : file->tensors()) {
      const auto [it, inserted] = ckpt->tensors_.emplace(name, &view);
      if (!inserted) {
        return absl::InvalidArgumentError(absl::StrCat(ctx, "tensor ", Quote(name),
                                                       " is in two shards: '", it->second->file,
                                                       "' and '", shard_path, "'"));
      }
      const auto listed = shard_of.find(name);
      if (listed == shard_of.end()) {
        return absl::InvalidArgumentError(absl::StrCat(ctx, "tensor ", Quote(name),
                                                       " is in shard '", shard_path,
                                                       "' but not listed in the index"));
      }
      if (listed->second != shard_name) {
        return absl::InvalidArgumentError(
            absl::StrCat(ctx, "tensor ", Quote(name), " is in shard '", shard_path,
                         "' but the index lists it in ", Quote(listed->second)));
      }
    }
    ckpt->files_.push_back(std::move(file));
  }
  for (const auto& [tensor, shard_name] : shard_of) {
    if (!ckpt->tensors_.contains(tensor)) {
      return absl::NotFoundError(absl::StrCat(ctx, "tensor ", Quote(tensor),
                                              " is listed in the index but absent from shard '",
                                              dir, "/", shard_name, "'"));
    }
  }
  return ckpt;
}

absl::StatusOr<const TensorView*> Checkpoint::Get(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    return absl::NotFoundError(
        absl::StrCat("tensor ", Quote(name), " not found in checkpoint '", dir_, "'"));
  }
  return it->second;
}

// ---- WriteSafetensors ----

absl::Status WriteSafetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                              const std::map<std::string, std::string>& metadata) {
  // Header keys keep the order of `tensors`, with __metadata__ first.
  nlohmann::ordered_json header = nlohmann::ordered_json::object();
  if (!metadata.empty()) {
    nlohmann::ordered_json meta = nlohmann::ordered_json::object();
    for (const auto& [k, v] : metadata) {
      if (FindInvalidUtf8(k) != absl::string_view::npos ||
          FindInvalidUtf8(v) != absl::string_view::npos) {
        return absl::InvalidArgumentError(absl::StrCat(
            "writing '", path, "': metadata key ", Quote(k), " or its value is not valid UTF-8"));
      }
      meta[k] = v;
    }
    header[std::string(kMetadataKey)] = std::move(meta);
  }
  uint64_t offset = 0;
  for (const TensorToWrite& t : tensors) {
    const std::string ctx = absl::StrCat("writing '", path, "', tensor ", Quote(t.name), ": ");
    if (t.name == kMetadataKey) {
      return absl::InvalidArgumentError(absl::StrCat(ctx, "name is reserved"));
    }
    if (FindInvalidUtf8(t.name) != absl::string_view::npos) {
      return absl::InvalidArgumentError(absl::StrCat(ctx, "name is not valid UTF-8"));
    }
    if (header.contains(t.name)) {
      return absl::InvalidArgumentError(absl::StrCat(ctx, "duplicate tensor name"));
    }
    absl::StatusOr<uint64_t> expected = ShapeBytes(t.shape, t.dtype);
    if (!expected.ok()) return WithPrefix(expected.status(), ctx);
    if (t.data.size() != *expected) {
      return absl::InvalidArgumentError(absl::StrCat(
          ctx, "data has ", t.data.size(), " bytes but shape [", absl::StrJoin(t.shape, ", "),
          "] of ", DTypeStr(t.dtype), " needs ", *expected));
    }
    header[t.name] = {{"dtype", std::string(DTypeName(t.dtype))},
                      {"shape", t.shape},
                      {"data_offsets", {offset, offset + t.data.size()}}};
    offset += t.data.size();
  }
  std::string header_text;
  try {
    header_text = header.dump();
  } catch (const std::exception& e) {
    return absl::InvalidArgumentError(
        absl::StrCat("writing '", path, "': cannot serialize header: ", e.what()));
  }
  header_text.append((8 - header_text.size() % 8) % 8, ' ');
  unsigned char len_bytes[8];
  for (int i = 0; i < 8; ++i) {
    len_bytes[i] = static_cast<unsigned char>(static_cast<uint64_t>(header_text.size()) >> (8 * i));
  }

  // Written beside the target and renamed over it, so readers never see a partial file.
  static std::atomic<uint64_t> counter{0};
  const std::string tmp_path = absl::StrCat(path, ".tmp.", ::getpid(), ".", counter.fetch_add(1));
  const int fd = ::open(tmp_path.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) return ErrnoError(errno, "cannot create", tmp_path);
  absl::Status status = WriteAll(fd, len_bytes, sizeof(len_bytes), tmp_path);
  if (status.ok()) status = WriteAll(fd, header_text.data(), header_text.size(), tmp_path);
  for (const TensorToWrite& t : tensors) {
    if (!status.ok()) break;
    status = WriteAll(fd, t.data.data(), t.data.size(), tmp_path);
  }
  if (status.ok() && ::fsync(fd) != 0) status = ErrnoError(errno, "cannot fsync", tmp_path);
  if (::close(fd) != 0 && status.ok()) status = ErrnoError(errno, "cannot close", tmp_path);
  if (status.ok() && ::rename(tmp_path.c_str(), path.c_str()) != 0) {
    status = ErrnoError(errno, absl::StrCat("cannot rename '", tmp_path, "' to"), path);
  }
  if (!status.ok()) ::unlink(tmp_path.c_str());
  return status;
}

}  // namespace tandem
