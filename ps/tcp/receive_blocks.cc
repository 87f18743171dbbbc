#include "ps/tcp/receive_blocks.h"

#include <algorithm>
#include <cstdlib>

#include "absl/status/status.h"
#include "absl/strings/str_cat.h"

namespace dtrain::ps::tcp {
namespace {

constexpr int64_t kAlign = 64;
constexpr int64_t kMinBlock = 1 << 20;

int64_t RoundUp(int64_t x, int64_t a) { return (x + a - 1) / a * a; }

}  // namespace

ReceiveBlocks::Block::Block(int64_t n)
    : data(static_cast<char*>(std::aligned_alloc(kAlign, static_cast<size_t>(n)))), size(data ? n : 0) {}

ReceiveBlocks::Block::~Block() { std::free(data); }

void ReceiveBlocks::BeginUpload() {
  if (this_upload_ > 0) last_upload_ = this_upload_;
  this_upload_ = 0;
  current_ = nullptr;
  used_ = 0;
}

absl::StatusOr<ReceiveBlocks::Room> ReceiveBlocks::Take(int64_t bytes, const char* limit_name) {
  const int64_t need = RoundUp(std::max<int64_t>(bytes, 1), kAlign);
  if (current_ == nullptr || used_ + need > current_->size) {
    // The rest of this upload, as far as the last one tells.
    const int64_t want = std::max({need, last_upload_ - this_upload_, kMinBlock});
    std::shared_ptr<Block> pick;
    for (const auto& b : blocks_) {
      if (b != current_ && Free(b) && b->size >= want && (pick == nullptr || b->size < pick->size)) pick = b;
    }
    // Free blocks too small for an upload like this one go (they were sized for smaller ones).
    for (auto it = blocks_.begin(); it != blocks_.end();) {
      if (*it != current_ && *it != pick && Free(*it) && (*it)->size < want) {
        held_ -= (*it)->size;
        it = blocks_.erase(it);
      } else {
        ++it;
      }
    }
    if (pick == nullptr) {
      int64_t size = RoundUp(want, kMinBlock);
      if (held_ + size > limit_) size = need;  // only what this piece needs, then
      if (held_ + size > limit_) {
        return absl::ResourceExhaustedError(
            absl::StrCat("a push's gradients would hold ", held_ + size, " bytes of received data on this ps task, "
                         "more than ", limit_name, "=", limit_, " (steps not yet applied keep theirs)"));
      }
      pick = std::make_shared<Block>(size);
      if (pick->data == nullptr) {
        return absl::ResourceExhaustedError(absl::StrCat("cannot allocate ", size, " bytes to receive a push"));
      }
      blocks_.push_back(pick);
      held_ += size;
    }
    current_ = pick;
    used_ = 0;
  }
  Room room;
  room.data = current_->data + used_;
  // The piece's reference keeps the whole block: shares ownership with the block, points at the piece.
  room.keep = std::shared_ptr<const void>(current_, room.data);
  used_ += need;
  this_upload_ += need;
  return room;
}

}  // namespace dtrain::ps::tcp
