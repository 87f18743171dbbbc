// Where a TCP attachment receives the fp32 gradients of its worker's pushes: blocks of memory the
// ParameterServer then reads in place (SliceUpload::WriteInPlace) until the push's step has been applied or
// dropped. Each piece taken comes with a reference to its block (`keep`); a block is handed out again only once
// no such reference is left, so gradients the ps has received (and checked) never change under it, whatever the
// worker sends next. Blocks are sized from the previous upload so that, in steady state, an upload fills one
// block and two blocks alternate at most.
//
// Thread-safety: not thread-safe (one lane's thread); the references it hands out may be dropped on any thread.
#ifndef DTRAIN_PS_TCP_RECEIVE_BLOCKS_H_
#define DTRAIN_PS_TCP_RECEIVE_BLOCKS_H_

#include <cstdint>
#include <memory>
#include <vector>

#include "absl/status/statusor.h"

namespace dtrain::ps::tcp {

class ReceiveBlocks {
 public:
  // At most `limit_bytes` in all blocks at once.
  explicit ReceiveBlocks(int64_t limit_bytes) : limit_(limit_bytes) {}

  struct Room {
    char* data = nullptr;               // `bytes` bytes, 64-byte aligned
    std::shared_ptr<const void> keep;   // keeps the block from being handed out again
  };
  // A new upload begins: its pieces come from a block nobody refers to any more.
  void BeginUpload();
  // Room for `bytes` of the current upload. ResourceExhausted, naming `limit_name`, when the blocks still referred
  // to plus this one would pass the limit.
  absl::StatusOr<Room> Take(int64_t bytes, const char* limit_name);

  int64_t held_bytes() const { return held_; }  // in all blocks
  int num_blocks() const { return static_cast<int>(blocks_.size()); }

 private:
  struct Block {
    explicit Block(int64_t n);
    ~Block();
    char* data = nullptr;
    int64_t size = 0;
  };
  bool Free(const std::shared_ptr<Block>& b) const { return b.use_count() == (b == current_ ? 2 : 1); }

  const int64_t limit_;
  std::vector<std::shared_ptr<Block>> blocks_;
  std::shared_ptr<Block> current_;
  int64_t used_ = 0;         // of current_
  int64_t this_upload_ = 0;  // bytes taken by the current upload
  int64_t last_upload_ = 0;  // by the previous one
  int64_t held_ = 0;
};

}  // namespace dtrain::ps::tcp

#endif  // DTRAIN_PS_TCP_RECEIVE_BLOCKS_H_
