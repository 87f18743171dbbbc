// A delay line for packet ids: what dtrain_netdelay holds between reading a packet's id from its NFQUEUE and
// letting the packet go. Every packet is held the same time, so the line is a FIFO: the packets due are
// always a prefix of it, and one batch verdict ("every id up to N") releases them all.
//
//   DelayLine line(/*delay_ns=*/10'000'000);
//   line.Add(packet_id, now_ns);                 // as each packet is read
//   if (std::optional<uint32_t> last = line.TakeDue(now_ns)) SendBatchVerdict(*last);
//   int64_t wake = line.NextDueNs();             // sleep until then (or until more packets come)
//
// Not thread-safe: one thread owns a line. Times are nanoseconds of one monotonic clock, chosen by the
// caller.
#ifndef DTRAIN_TESTS_NETDELAY_DELAY_LINE_H_
#define DTRAIN_TESTS_NETDELAY_DELAY_LINE_H_

#include <cstddef>
#include <cstdint>
#include <deque>
#include <optional>

namespace dtrain::netdelay {

class DelayLine {
 public:
  // delay_ns >= 0: how long each packet is held after it was added.
  explicit DelayLine(int64_t delay_ns);

  // A packet read at now_ns. Times must not go backwards from one call to the next (a FIFO of equal delays).
  void Add(uint32_t id, int64_t now_ns);

  // Removes every packet whose time has come (added at or before now_ns - delay) and returns the id of the
  // last of them, for one batch verdict; nullopt when none is due.
  std::optional<uint32_t> TakeDue(int64_t now_ns);

  // When the oldest held packet is due, or -1 when none is held.
  int64_t NextDueNs() const;

  // Removes every held packet (at exit: they all go out at once) and returns the id of the last, if any.
  std::optional<uint32_t> TakeAll();

  size_t size() const { return held_.size(); }
  size_t max_size() const { return max_size_; }

 private:
  struct Held {
    uint32_t id;
    int64_t due_ns;
  };
  const int64_t delay_ns_;
  std::deque<Held> held_;
  size_t max_size_ = 0;
};

}  // namespace dtrain::netdelay

#endif  // DTRAIN_TESTS_NETDELAY_DELAY_LINE_H_
