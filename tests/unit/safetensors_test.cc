#include "common/tensor/safetensors.h"

#include <unistd.h>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <random>
#include <string>
#include <vector>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"
#include "gmock/gmock.h"
#include "gtest/gtest.h"

namespace tandem {
namespace {

namespace fs = std::filesystem;
using ::testing::AllOf;
using ::testing::HasSubstr;

std::vector<std::byte> Bytes(size_t n, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<std::byte> out(n);
  for (auto& b : out) b = static_cast<std::byte>(rng() & 0xff);
  return out;
}

void WriteFileBytes(const std::string& path, std::string_view contents) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  ASSERT_TRUE(out.good()) << path;
  out.write(contents.data(), static_cast<std::streamsize>(contents.size()));
  ASSERT_TRUE(out.good()) << path;
}

// An 8-byte little-endian `declared_len`, then `header`, then `data`.
std::string RawSafetensors(std::string_view header, std::string_view data, uint64_t declared_len) {
  std::string out;
  for (int i = 0; i < 8; ++i) out.push_back(static_cast<char>(declared_len >> (8 * i)));
  out.append(header);
  out.append(data);
  return out;
}

std::string RawSafetensors(std::string_view header, std::string_view data = "") {
  return RawSafetensors(header, data, header.size());
}

class SafetensorsTest : public ::testing::Test {
 protected:
  void SetUp() override {
    const auto* info = ::testing::UnitTest::GetInstance()->current_test_info();
    std::string name = absl::StrCat("safetensors_test_", ::getpid(), "_", info->test_suite_name(),
                                    "_", info->name());
    for (char& c : name) {
      if (c == '/') c = '_';
    }
    dir_ = (fs::path(::testing::TempDir()) / name).string();
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  std::string Path(const std::string& file) const { return absl::StrCat(dir_, "/", file); }

  // Writes a raw file with a correct length prefix and opens it.
  absl::StatusOr<std::unique_ptr<SafetensorsFile>> OpenRaw(std::string_view header,
                                                           std::string_view data = "") {
    const std::string path = Path("hostile.safetensors");
    WriteFileBytes(path, RawSafetensors(header, data));
    return SafetensorsFile::Open(path);
  }

  std::string dir_;
};

// Asserts that `result` failed with `code` and a message naming `file` and each of `names`.
template <typename T>
void ExpectError(const absl::StatusOr<T>& result, absl::StatusCode code, const std::string& file,
                 const std::vector<std::string>& names = {}) {
  ASSERT_FALSE(result.ok());
  EXPECT_EQ(result.status().code(), code) << result.status();
  EXPECT_THAT(result.status().message(), HasSubstr(file)) << result.status();
  for (const std::string& name : names) {
    EXPECT_THAT(result.status().message(), HasSubstr(name)) << result.status();
  }
}

// ---- Round trips ----

class SafetensorsDTypeTest : public SafetensorsTest, public ::testing::WithParamInterface<DType> {};

TEST_P(SafetensorsDTypeTest, RoundTrip) {
  const DType dtype = GetParam();
  const size_t es = DTypeSize(dtype);
  std::vector<TensorToWrite> tensors = {
      {"model.embed_tokens.weight", dtype, {5, 3}, Bytes(15 * es, 1)},
      {"a.scalar", dtype, {}, Bytes(es, 2)},
      {"z.empty", dtype, {0, 4}, {}},
      {"m.bias", dtype, {7}, Bytes(7 * es, 3)},
  };
  const std::map<std::string, std::string> metadata = {{"format", "pt"}, {"note", "héllo"}};
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, tensors, metadata).ok());

  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->path(), path);
  EXPECT_EQ((*file)->metadata(), metadata);
  ASSERT_EQ((*file)->tensors().size(), tensors.size());
  for (const TensorToWrite& t : tensors) {
    auto it = (*file)->tensors().find(t.name);
    ASSERT_NE(it, (*file)->tensors().end()) << t.name;
    const TensorView& v = it->second;
    EXPECT_EQ(v.name, t.name);
    EXPECT_EQ(v.dtype, dtype);
    EXPECT_EQ(v.shape, t.shape);
    EXPECT_EQ(v.file, path);
    ASSERT_EQ(v.nbytes, t.data.size());
    EXPECT_EQ(v.num_elements() * static_cast<int64_t>(es), static_cast<int64_t>(v.nbytes));
    if (v.nbytes > 0) {
      EXPECT_EQ(std::memcmp(v.data, t.data.data(), v.nbytes), 0) << t.name;
    }
  }

  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_EQ((*ckpt)->dir(), dir_);
  EXPECT_EQ((*ckpt)->tensors().size(), tensors.size());
  auto got = (*ckpt)->Get("m.bias");
  ASSERT_TRUE(got.ok()) << got.status();
  EXPECT_EQ(std::memcmp((*got)->data, tensors[3].data.data(), tensors[3].data.size()), 0);
  ExpectError((*ckpt)->Get("no.such.tensor"), absl::StatusCode::kNotFound, dir_,
              {"no.such.tensor"});
}

INSTANTIATE_TEST_SUITE_P(AllDTypes, SafetensorsDTypeTest,
                         ::testing::Values(DType::kF32, DType::kF16, DType::kBF16),
                         [](const ::testing::TestParamInfo<DType>& info) {
                           return std::string(DTypeName(info.param));
                         });

TEST_F(SafetensorsTest, WriterPadsHeaderToEightBytesWithSpaces) {
  const std::string path = Path("x.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"t", DType::kF16, {3}, Bytes(6, 9)}}).ok());
  std::ifstream in(path, std::ios::binary);
  const std::string contents((std::istreambuf_iterator<char>(in)),
                             std::istreambuf_iterator<char>());
  ASSERT_GE(contents.size(), 8u);
  uint64_t n = 0;
  for (int i = 7; i >= 0; --i) n = (n << 8) | static_cast<uint8_t>(contents[i]);
  EXPECT_EQ(n % 8, 0u);
  EXPECT_EQ(contents.size(), 8 + n + 6);
  const std::string header = contents.substr(8, n);
  EXPECT_EQ(header.front(), '{');
  const size_t close = header.rfind('}');
  EXPECT_EQ(header.find_first_not_of(' ', close + 1), std::string::npos);
  for (const auto& entry : fs::directory_iterator(dir_)) {
    EXPECT_EQ(entry.path().filename().string(), "x.safetensors");  // no temp file left behind
  }
}

TEST_F(SafetensorsTest, WriterRejectsDataSizeMismatch) {
  const std::string path = Path("bad.safetensors");
  const absl::Status s = WriteSafetensors(path, {{"w", DType::kF32, {2, 2}, Bytes(12, 1)}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("w")));
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(SafetensorsTest, WriterRejectsNegativeDimAndDuplicateName) {
  const std::string path = Path("bad.safetensors");
  absl::Status s = WriteSafetensors(path, {{"neg", DType::kF32, {-1}, {}}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("neg")));
  s = WriteSafetensors(
      path, {{"d", DType::kF32, {1}, Bytes(4, 1)}, {"d", DType::kF32, {1}, Bytes(4, 2)}});
  EXPECT_EQ(s.code(), absl::StatusCode::kInvalidArgument) << s;
  EXPECT_THAT(s.message(), AllOf(HasSubstr(path), HasSubstr("duplicate")));
  EXPECT_FALSE(fs::exists(path));
}

TEST_F(SafetensorsTest, WriterReportsIoErrorWithPath) {
  const std::string path = Path("no_such_dir/model.safetensors");
  const absl::Status s = WriteSafetensors(path, {{"t", DType::kF32, {1}, Bytes(4, 1)}});
  EXPECT_FALSE(s.ok());
  EXPECT_THAT(s.message(), HasSubstr(path));
}

TEST_F(SafetensorsTest, WriterReplacesExistingFile) {
  const std::string path = Path("model.safetensors");
  ASSERT_TRUE(WriteSafetensors(path, {{"old", DType::kF32, {1}, Bytes(4, 1)}}).ok());
  ASSERT_TRUE(WriteSafetensors(path, {{"new", DType::kF32, {1}, Bytes(4, 2)}}).ok());
  auto file = SafetensorsFile::Open(path);
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->tensors().size(), 1u);
  EXPECT_TRUE((*file)->tensors().contains("new"));
}

TEST_F(SafetensorsTest, DataRegionGapsAreAccepted) {
  auto file = OpenRaw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("b":{"dtype":"F16","shape":[2],"data_offsets":[12,16]}})",
                      std::string(16, 'x'));
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_EQ((*file)->tensors().size(), 2u);
}

TEST_F(SafetensorsTest, EmptyHeaderObjectIsAnEmptyFile) {
  auto file = OpenRaw("{}");
  ASSERT_TRUE(file.ok()) << file.status();
  EXPECT_TRUE((*file)->tensors().empty());
}

// ---- Hostile single files ----

TEST_F(SafetensorsTest, MissingFileIsNotFound) {
  const std::string path = Path("absent.safetensors");
  ExpectError(SafetensorsFile::Open(path), absl::StatusCode::kNotFound, path);
}

TEST_F(SafetensorsTest, EmptyFileIsTruncated) {
  const std::string path = Path("empty.safetensors");
  WriteFileBytes(path, "");
  ExpectError(SafetensorsFile::Open(path), absl::StatusCode::kDataLoss, path, {"truncated"});
}

TEST_F(SafetensorsTest, FileShorterThanLengthPrefixIsTruncated) {
  const std::string path = Path("short.safetensors");
  WriteFileBytes(path, std::string("\x02\x00\x00", 3));
  ExpectError(SafetensorsFile::Open(path), absl::StatusCode::kDataLoss, path, {"truncated"});
}

TEST_F(SafetensorsTest, HeaderShorterThanDeclaredIsTruncated) {
  const std::string path = Path("short_header.safetensors");
  WriteFileBytes(path, RawSafetensors("{}", "", 100));
  ExpectError(SafetensorsFile::Open(path), absl::StatusCode::kDataLoss, path, {"truncated"});
}

TEST_F(SafetensorsTest, HeaderLengthBeyondFileIsTruncated) {
  const std::string path = Path("beyond.safetensors");
  WriteFileBytes(path, RawSafetensors("{}", std::string(64, ' '), 4096));
  ExpectError(SafetensorsFile::Open(path), absl::StatusCode::kDataLoss, path, {"4096"});
}

TEST_F(SafetensorsTest, AbsurdHeaderSizeIsRejected) {
  for (const uint64_t declared :
       {SafetensorsFile::kMaxHeaderBytes + 1, uint64_t{1} << 40, ~uint64_t{0}}) {
    const std::string path = Path("absurd.safetensors");
    WriteFileBytes(path, RawSafetensors("{}", "", declared));
    ExpectError(SafetensorsFile::Open(path), absl::StatusCode::kInvalidArgument, path,
                {"exceeds the limit"});
  }
}

TEST_F(SafetensorsTest, OffsetsOutOfRange) {
  ExpectError(
      OpenRaw(R"({"w":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})", std::string(8, 'x')),
      absl::StatusCode::kDataLoss, "hostile.safetensors", {"'w'", "out of range"});
}

TEST_F(SafetensorsTest, OffsetsEndBeforeBegin) {
  ExpectError(
      OpenRaw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[8,4]}})", std::string(8, 'x')),
      absl::StatusCode::kInvalidArgument, "hostile.safetensors", {"'w'", "before begin"});
}

TEST_F(SafetensorsTest, OverlappingTensors) {
  ExpectError(OpenRaw(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},)"
                      R"("b":{"dtype":"F32","shape":[2],"data_offsets":[4,12]}})",
                      std::string(12, 'x')),
              absl::StatusCode::kInvalidArgument, "hostile.safetensors", {"'a'", "'b'", "overlap"});
  // The same range twice is an overlap too.
  ExpectError(OpenRaw(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("b":{"dtype":"BF16","shape":[2],"data_offsets":[0,4]}})",
                      std::string(4, 'x')),
              absl::StatusCode::kInvalidArgument, "hostile.safetensors", {"'a'", "'b'"});
}

TEST_F(SafetensorsTest, UnsupportedDtype) {
  for (const std::string& dtype : std::vector<std::string>{"I16", "F64", "U8", "f32", "i8", ""}) {
    ExpectError(OpenRaw(absl::StrCat(R"({"w":{"dtype":")", dtype,
                                     R"(","shape":[1],"data_offsets":[0,1]}})"),
                        std::string(8, 'x')),
                absl::StatusCode::kInvalidArgument, "hostile.safetensors",
                {"'w'", "unsupported dtype", absl::StrCat("'", dtype, "'")});
  }
}

TEST_F(SafetensorsTest, ByteSizeMismatch) {
  ExpectError(
      OpenRaw(R"({"w":{"dtype":"F32","shape":[3],"data_offsets":[0,8]}})", std::string(8, 'x')),
      absl::StatusCode::kInvalidArgument, "hostile.safetensors", {"'w'", "mismatch"});
}

TEST_F(SafetensorsTest, NegativeDimension) {
  ExpectError(OpenRaw(R"({"w":{"dtype":"F32","shape":[-2,-2],"data_offsets":[0,16]}})",
                      std::string(16, 'x')),
              absl::StatusCode::kInvalidArgument, "hostile.safetensors", {"'w'", "negative"});
}

TEST_F(SafetensorsTest, NonIntegerDimension) {
  for (const std::string& dim :
       std::vector<std::string>{"2.5", "2.0", "1e1", "\"2\"", "null", "[2]", "true"}) {
    ExpectError(
        OpenRaw(
            absl::StrCat(R"({"w":{"dtype":"F32","shape":[)", dim, R"(],"data_offsets":[0,8]}})"),
            std::string(8, 'x')),
        absl::StatusCode::kInvalidArgument, "hostile.safetensors", {"'w'", "shape dimension"});
  }
}

TEST_F(SafetensorsTest, HugeDimensionAndShapeProductOverflow) {
  for (const std::string& shape : std::vector<std::string>{
           "1099511627776,1099511627776", "4294967296,4294967296,0", "18446744073709551615",
           "4611686018427387904", "99999999999999999999999"}) {
    ExpectError(OpenRaw(absl::StrCat(R"({"w":{"dtype":"F32","shape":[)", shape,
                                     R"(],"data_offsets":[0,8]}})"),
                        std::string(8, 'x')),
                absl::StatusCode::kInvalidArgument, "hostile.safetensors", {"'w'"});
  }
}

TEST_F(SafetensorsTest, BadOffsetValues) {
  for (const std::string& offsets :
       std::vector<std::string>{"[0]", "[0,4,8]", "[-4,0]", "[0,4.0]", "\"0,4\"", "{}",
                                "[0,18446744073709551615]", "[0,1e30]"}) {
    ExpectError(
        OpenRaw(absl::StrCat(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":)", offsets, "}}"),
                std::string(8, 'x')),
        absl::StatusCode::kInvalidArgument, "hostile.safetensors", {"'w'", "data_offsets"});
  }
}

TEST_F(SafetensorsTest, NonUtf8Json) {
  for (const std::string& bad :
       std::vector<std::string>{std::string("\xff"), std::string("\xc0\xaf"),
                                std::string("\xed\xa0\x80"), std::string("\xe2\x82")}) {
    ExpectError(OpenRaw(absl::StrCat(R"({"w)", bad,
                                     R"(":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})"),
                        std::string(4, 'x')),
                absl::StatusCode::kInvalidArgument, "hostile.safetensors", {"UTF-8"});
  }
}

TEST_F(SafetensorsTest, InvalidJson) {
  for (const std::string& header :
       std::vector<std::string>{"", "{", R"({"w":})", R"({"w":{"dtype":"F32",}})", "{} trailing",
                                std::string("\0{}", 3), R"({"w":"\ud800"})", "// c\n{}"}) {
    ExpectError(OpenRaw(header), absl::StatusCode::kInvalidArgument, "hostile.safetensors",
                {"invalid JSON"});
  }
}

TEST_F(SafetensorsTest, JsonNotAnObject) {
  for (const std::string& header : std::vector<std::string>{"[]", "42", "\"x\"", "null"}) {
    ExpectError(OpenRaw(header), absl::StatusCode::kInvalidArgument, "hostile.safetensors",
                {"not an object"});
  }
}

TEST_F(SafetensorsTest, DeepNestingIsRejected) {
  const std::string header =
      absl::StrCat(R"({"w":)", std::string(100000, '['), std::string(100000, ']'), "}");
  ExpectError(OpenRaw(header), absl::StatusCode::kInvalidArgument, "hostile.safetensors",
              {"nesting"});
}

TEST_F(SafetensorsTest, DuplicateKeys) {
  ExpectError(OpenRaw(R"({"w":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},)"
                      R"("w":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})",
                      std::string(8, 'x')),
              absl::StatusCode::kInvalidArgument, "hostile.safetensors", {"duplicate", "'w'"});
  ExpectError(OpenRaw(R"({"w":{"dtype":"F32","dtype":"F16","shape":[1],"data_offsets":[0,4]}})",
                      std::string(4, 'x')),
              absl::StatusCode::kInvalidArgument, "hostile.safetensors", {"duplicate", "dtype"});
}

TEST_F(SafetensorsTest, TensorEntryMissingFields) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"({"shape":[1],"data_offsets":[0,4]})", "dtype"},
      {R"({"dtype":"F32","data_offsets":[0,4]})", "shape"},
      {R"({"dtype":"F32","shape":[1]})", "data_offsets"},
  };
  for (const auto& [entry, field] : cases) {
    ExpectError(OpenRaw(absl::StrCat(R"({"w":)", entry, "}"), std::string(4, 'x')),
                absl::StatusCode::kInvalidArgument, "hostile.safetensors",
                {"'w'", absl::StrCat("missing field '", field, "'")});
  }
}

TEST_F(SafetensorsTest, TensorEntryWrongTypes) {
  const std::vector<std::pair<std::string, std::string>> cases = {
      {R"("not an object")", "must be an object"},
      {R"([1,2])", "must be an object"},
      {R"({"dtype":5,"shape":[1],"data_offsets":[0,4]})", "'dtype' must be a string"},
      {R"({"dtype":"F32","shape":"1","data_offsets":[0,4]})", "'shape' must be an array"},
      {R"({"dtype":"F32","shape":{"a":1},"data_offsets":[0,4]})", "'shape' must be an array"},
      {R"({"dtype":"F32","shape":[1],"data_offsets":null})", "'data_offsets' must be an array"},
  };
  for (const auto& [entry, what] : cases) {
    ExpectError(OpenRaw(absl::StrCat(R"({"w":)", entry, "}"), std::string(4, 'x')),
                absl::StatusCode::kInvalidArgument, "hostile.safetensors", {"'w'", what});
  }
}

TEST_F(SafetensorsTest, MetadataValuesMustBeStrings) {
  for (const std::string& meta :
       std::vector<std::string>{R"({"a":1})", R"({"a":null})", R"({"a":{"b":"c"}})"}) {
    ExpectError(OpenRaw(absl::StrCat(R"({"__metadata__":)", meta, "}")),
                absl::StatusCode::kInvalidArgument, "hostile.safetensors",
                {"__metadata__", "'a'", "must be a string"});
  }
  for (const std::string& meta : std::vector<std::string>{R"("x")", "[]", "null"}) {
    ExpectError(OpenRaw(absl::StrCat(R"({"__metadata__":)", meta, "}")),
                absl::StatusCode::kInvalidArgument, "hostile.safetensors",
                {"__metadata__", "must be an object"});
  }
}

TEST_F(SafetensorsTest, HostileTensorNameIsEscapedInMessages) {
  auto result = OpenRaw(R"({"bad\u0000\n":{"dtype":"I16","shape":[1],"data_offsets":[0,1]}})",
                        std::string(1, 'x'));
  ExpectError(result, absl::StatusCode::kInvalidArgument, "hostile.safetensors", {"'bad\\x00\\n'"});
}

// ---- Checkpoint directories ----

class CheckpointTest : public SafetensorsTest {
 protected:
  void WriteIndex(const std::string& weight_map_json) {
    WriteFileBytes(
        Path("model.safetensors.index.json"),
        absl::StrCat(R"({"metadata":{"total_size":40},"weight_map":)", weight_map_json, "}"));
  }
  void WriteTwoShards() {
    ASSERT_TRUE(WriteSafetensors(Path("model-00001-of-00002.safetensors"),
                                 {{"a", DType::kF32, {2}, Bytes(8, 1)},
                                  {"b", DType::kBF16, {2, 3}, Bytes(12, 2)}},
                                 {{"format", "pt"}})
                    .ok());
    ASSERT_TRUE(WriteSafetensors(Path("model-00002-of-00002.safetensors"),
                                 {{"c", DType::kF16, {10}, Bytes(20, 3)}})
                    .ok());
  }
  static constexpr char kGoodMap[] =
      R"({"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",)"
      R"("c":"model-00002-of-00002.safetensors"})";
};

TEST_F(CheckpointTest, ShardedRoundTrip) {
  WriteTwoShards();
  WriteIndex(kGoodMap);
  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  ASSERT_EQ((*ckpt)->tensors().size(), 3u);
  const std::vector<
      std::tuple<std::string, DType, std::vector<int64_t>, std::vector<std::byte>, std::string>>
      expected = {{"a", DType::kF32, {2}, Bytes(8, 1), "model-00001-of-00002.safetensors"},
                  {"b", DType::kBF16, {2, 3}, Bytes(12, 2), "model-00001-of-00002.safetensors"},
                  {"c", DType::kF16, {10}, Bytes(20, 3), "model-00002-of-00002.safetensors"}};
  for (const auto& [name, dtype, shape, data, shard] : expected) {
    auto view = (*ckpt)->Get(name);
    ASSERT_TRUE(view.ok()) << view.status();
    EXPECT_EQ((*view)->dtype, dtype);
    EXPECT_EQ((*view)->shape, shape);
    EXPECT_EQ((*view)->file, Path(shard));
    ASSERT_EQ((*view)->nbytes, data.size());
    EXPECT_EQ(std::memcmp((*view)->data, data.data(), data.size()), 0) << name;
    EXPECT_EQ((*ckpt)->tensors().at(name), *view);
  }
}

TEST_F(CheckpointTest, IndexTakesPrecedenceOverSingleFile) {
  WriteTwoShards();
  WriteIndex(kGoodMap);
  ASSERT_TRUE(
      WriteSafetensors(Path("model.safetensors"), {{"single", DType::kF32, {1}, Bytes(4, 1)}})
          .ok());
  auto ckpt = Checkpoint::Open(dir_);
  ASSERT_TRUE(ckpt.ok()) << ckpt.status();
  EXPECT_FALSE((*ckpt)->tensors().contains("single"));
  EXPECT_TRUE((*ckpt)->tensors().contains("c"));
}

TEST_F(CheckpointTest, EmptyDirectoryIsNotFound) {
  ExpectError(Checkpoint::Open(dir_), absl::StatusCode::kNotFound, dir_);
  ExpectError(Checkpoint::Open(dir_ + "/missing"), absl::StatusCode::kNotFound, dir_ + "/missing");
}

TEST_F(CheckpointTest, HostileSingleFileErrorPropagates) {
  WriteFileBytes(Path("model.safetensors"), "");
  ExpectError(Checkpoint::Open(dir_), absl::StatusCode::kDataLoss, Path("model.safetensors"),
              {"truncated"});
}

TEST_F(CheckpointTest, MissingShard) {
  WriteTwoShards();
  fs::remove(Path("model-00002-of-00002.safetensors"));
  WriteIndex(kGoodMap);
  ExpectError(Checkpoint::Open(dir_), absl::StatusCode::kNotFound,
              "model-00002-of-00002.safetensors", {"model.safetensors.index.json"});
}

TEST_F(CheckpointTest, ShardNameEscapingDirectory) {
  WriteTwoShards();
  for (const std::string& shard :
       std::vector<std::string>{"../model-00002-of-00002.safetensors", "sub/x.safetensors",
                                "/etc/passwd", "..", ".", ""}) {
    WriteIndex(absl::StrCat(R"({"a":"model-00001-of-00002.safetensors",)",
                            R"("b":"model-00001-of-00002.safetensors","c":")", shard, R"("})"));
    ExpectError(Checkpoint::Open(dir_), absl::StatusCode::kInvalidArgument,
                "model.safetensors.index.json", {"'c'", "plain file name"});
  }
  WriteIndex(R"({"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",)"
             R"("c":"model-00002-of-00002.safetensors\u0000.x"})");
  ExpectError(Checkpoint::Open(dir_), absl::StatusCode::kInvalidArgument,
              "model.safetensors.index.json", {"'c'", "plain file name"});
}

TEST_F(CheckpointTest, TensorListedButAbsentFromShard) {
  WriteTwoShards();
  WriteIndex(
      R"({"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",)"
      R"("c":"model-00002-of-00002.safetensors","ghost":"model-00002-of-00002.safetensors"})");
  ExpectError(Checkpoint::Open(dir_), absl::StatusCode::kNotFound,
              "model-00002-of-00002.safetensors", {"'ghost'", "absent"});
}

TEST_F(CheckpointTest, TensorInShardButNotListed) {
  WriteTwoShards();
  WriteIndex(R"({"a":"model-00001-of-00002.safetensors","c":"model-00002-of-00002.safetensors"})");
  ExpectError(Checkpoint::Open(dir_), absl::StatusCode::kInvalidArgument,
              "model-00001-of-00002.safetensors", {"'b'", "not listed"});
}

TEST_F(CheckpointTest, TensorInTwoShards) {
  WriteTwoShards();
  ASSERT_TRUE(WriteSafetensors(
                  Path("model-00002-of-00002.safetensors"),
                  {{"c", DType::kF16, {10}, Bytes(20, 3)}, {"a", DType::kF32, {2}, Bytes(8, 1)}})
                  .ok());
  WriteIndex(kGoodMap);
  ExpectError(Checkpoint::Open(dir_), absl::StatusCode::kInvalidArgument,
              "model-00002-of-00002.safetensors", {"'a'"});
}

TEST_F(CheckpointTest, TensorListedTwiceInIndex) {
  WriteTwoShards();
  WriteIndex(R"({"a":"model-00001-of-00002.safetensors","b":"model-00001-of-00002.safetensors",)"
             R"("c":"model-00002-of-00002.safetensors","a":"model-00002-of-00002.safetensors"})");
  ExpectError(Checkpoint::Open(dir_), absl::StatusCode::kInvalidArgument,
              "model.safetensors.index.json", {"duplicate", "'a'"});
}

TEST_F(CheckpointTest, MalformedIndex) {
  WriteTwoShards();
  const std::string index = "model.safetensors.index.json";
  for (const std::string& contents :
       std::vector<std::string>{"", "{", "[]", R"({"metadata":{}})", R"({"weight_map":[]})",
                                R"({"weight_map":"x"})", "{\"weight_map\":{\"a\":\"\xff\"}}"}) {
    WriteFileBytes(Path(index), contents);
    ExpectError(Checkpoint::Open(dir_), absl::StatusCode::kInvalidArgument, index);
  }
  WriteIndex(R"({"a":1})");
  ExpectError(Checkpoint::Open(dir_), absl::StatusCode::kInvalidArgument, index,
              {"'a'", "must be a string"});
}

TEST_F(CheckpointTest, HostileShardErrorNamesShardAndIndex) {
  WriteTwoShards();
  WriteFileBytes(Path("model-00002-of-00002.safetensors"),
                 RawSafetensors(R"({"c":{"dtype":"F64","shape":[10],"data_offsets":[0,80]}})",
                                std::string(80, 'x')));
  WriteIndex(kGoodMap);
  ExpectError(Checkpoint::Open(dir_), absl::StatusCode::kInvalidArgument,
              "model-00002-of-00002.safetensors",
              {"model.safetensors.index.json", "'c'", "unsupported dtype"});
}

// ---- Fuzz-style robustness ----

TEST_F(SafetensorsTest, MutatedHeadersNeverCrash) {
  const std::string valid_path = Path("valid.safetensors");
  ASSERT_TRUE(WriteSafetensors(valid_path,
                               {{"layers.0.w", DType::kBF16, {4, 4}, Bytes(32, 1)},
                                {"layers.0.b", DType::kF32, {4}, Bytes(16, 2)},
                                {"norm", DType::kF16, {3}, Bytes(6, 3)}},
                               {{"format", "pt"}})
                  .ok());
  std::ifstream in(valid_path, std::ios::binary);
  const std::string valid((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  uint64_t header_len = 0;
  for (int i = 7; i >= 0; --i) header_len = (header_len << 8) | static_cast<uint8_t>(valid[i]);
  ASSERT_LT(8 + header_len, valid.size());

  std::mt19937 rng(20240607);
  const std::string kInteresting = "{}[]\",:-.0123456789eE \\u\xff\x80";
  int ok = 0;
  for (int iter = 0; iter < 2000; ++iter) {
    std::string bytes = valid;
    const int mutations = 1 + static_cast<int>(rng() % 4);
    for (int m = 0; m < mutations; ++m) {
      // Mostly the header (and its length prefix); occasionally the data region.
      const size_t pos = rng() % (8 + header_len);
      switch (rng() % 4) {
        case 0: bytes[pos] = static_cast<char>(bytes[pos] ^ (1 << (rng() % 8))); break;
        case 1: bytes[pos] = static_cast<char>(rng() & 0xff); break;
        case 2: bytes[pos] = kInteresting[rng() % kInteresting.size()]; break;
        case 3: bytes.resize(rng() % bytes.size()); break;
      }
      if (bytes.empty()) break;
    }
    // A fresh name each time: rewriting one file in place makes ext4 flush it on every close.
    const std::string path = Path(absl::StrCat("mutated_", iter, ".safetensors"));
    WriteFileBytes(path, bytes);
    auto file = SafetensorsFile::Open(path);
    fs::remove(path);
    if (!file.ok()) {
      EXPECT_THAT(file.status().message(), HasSubstr(path));
      continue;
    }
    ++ok;
    for (const auto& [name, view] : (*file)->tensors()) {
      EXPECT_EQ(static_cast<size_t>(view.num_elements()) * DTypeSize(view.dtype), view.nbytes)
          << name;
      // Touch every byte: a view outside the mapping faults here (or is caught by ASan).
      unsigned sum = 0;
      for (size_t i = 0; i < view.nbytes; ++i) sum += static_cast<unsigned>(view.data[i]);
      (void)sum;
    }
  }
  // Some mutations (e.g. in padding spaces or tensor names) keep the file valid.
  EXPECT_GT(ok, 0);
}

}  // namespace
}  // namespace tandem
