#include "worker/batch/row_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "glog/logging.h"

namespace dtrain::worker {

RowCache::RowCache(std::vector<int> dims, int64_t capacity, int staleness)
    : capacity_(capacity), staleness_(staleness) {
  CHECK_GT(capacity, 0) << "RowCache: capacity";
  CHECK_GE(staleness, 0) << "RowCache: staleness";
  tables_.resize(dims.size());
  for (size_t t = 0; t < dims.size(); ++t) tables_[t].dim = dims[t];
}

void RowCache::Serve(int t, int64_t step, const std::vector<int64_t>& ids, float* rows, Plan* plan) {
  Table& tab = tables_[t];
  plan->pull_ids.clear();
  plan->pull_pos.clear();
  plan->cached.assign(ids.size(), 0);
  plan->slot.assign(ids.size(), -1);
  // The step's ids land anywhere in the table: fetch the index entries and slots a few ids ahead.
  for (size_t i = 0; i < ids.size() && i < kAhead; ++i) tab.slot_of.prefetch(ids[i]);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kAhead < ids.size()) tab.slot_of.prefetch(ids[i + kAhead]);
    auto it = tab.slot_of.find(ids[i]);
    if (it != tab.slot_of.end()) plan->slot[i] = it->second;
    if (it != tab.slot_of.end() && step - tab.pulled[it->second] <= staleness_) {
      const int32_t s = it->second;
      std::memcpy(rows + i * tab.dim, tab.part(s, kValues), sizeof(float) * tab.dim);
      tab.referenced[s] = 1;
      plan->cached[i] = 1;
      ++hits_;
    } else {
      plan->pull_ids.push_back(ids[i]);
      plan->pull_pos.push_back(static_cast<int32_t>(i));
      ++misses_;
    }
  }
}

int32_t RowCache::Take(Table& tab, int64_t id) {
  int32_t s;
  if (static_cast<int64_t>(tab.id.size()) < capacity_) {
    s = static_cast<int32_t>(tab.id.size());
    tab.id.push_back(id);
    tab.pulled.push_back(0);
    if (s % kBlockSlots == 0) tab.blocks.emplace_back(new float[static_cast<size_t>(kBlockSlots) * 4 * tab.dim]);
    tab.rate.push_back(0);
    tab.has_gathered.push_back(0);
    tab.has_last_push.push_back(0);
    tab.referenced.push_back(0);
  } else {
    const int32_t n = static_cast<int32_t>(tab.id.size());
    while (tab.referenced[tab.hand]) {
      tab.referenced[tab.hand] = 0;
      tab.hand = tab.hand + 1 == n ? 0 : tab.hand + 1;
    }
    s = tab.hand;
    tab.hand = tab.hand + 1 == n ? 0 : tab.hand + 1;
    const int64_t old = tab.id[s];
    if (tab.has_gathered[s]) {  // its gathered gradients still go to the ps, with the next push
      const float* g = tab.part(s, kGathered);
      std::vector<float>& orphan = tab.orphans[old];
      if (orphan.empty()) orphan.assign(tab.dim, 0.0f);
      for (int k = 0; k < tab.dim; ++k) orphan[k] += g[k];
    }
    tab.slot_of.erase(old);
    tab.id[s] = id;
  }
  std::fill_n(tab.part(s, kGathered), tab.dim, 0.0f);
  tab.has_gathered[s] = 0;
  tab.has_last_push[s] = 0;
  tab.rate[s] = 0;
  tab.referenced[s] = 0;
  tab.slot_of[id] = s;
  return s;
}

void RowCache::Prefetch(Table& tab, int32_t s) {
  if (s < 0) return;
  __builtin_prefetch(&tab.id[s]);
  const char* p = reinterpret_cast<const char*>(tab.part(s, kValues));
  for (int64_t b = 0; b < int64_t{16} * tab.dim; b += 64) __builtin_prefetch(p + b, 1);
}

int32_t RowCache::SlotOf(const Table& tab, int32_t hint, int64_t id) {
  if (hint >= 0 && tab.id[hint] == id) return hint;
  auto it = tab.slot_of.find(id);
  return it == tab.slot_of.end() ? -1 : it->second;
}

void RowCache::Store(int t, int64_t step, Plan* plan, const float* pulled, float* rows) {
  Table& tab = tables_[t];
  for (size_t k = 0; k < plan->pull_ids.size(); ++k) {
    if (k + kAhead < plan->pull_ids.size()) Prefetch(tab, plan->slot[plan->pull_pos[k + kAhead]]);
    const float* row = pulled + k * tab.dim;
    const int32_t pos = plan->pull_pos[k];
    // A row pulled again keeps its slot and what it gathered (pushed with this step's gradients).
    int32_t s = SlotOf(tab, plan->slot[pos], plan->pull_ids[k]);
    if (s < 0) s = Take(tab, plan->pull_ids[k]);
    plan->slot[pos] = s;
    float* base = tab.part(s, kBase);
    if (tab.has_last_push[s]) {
      // What the ps did with the gradient pushed with the last pull: base - row = rate * last_push (exact for
      // SGD with one worker; a per-row fit of adagrad's per-element steps, and of other workers' updates).
      const float* g = tab.part(s, kLastPush);
      double dot = 0, gg = 0;
      for (int d = 0; d < tab.dim; ++d) {
        dot += static_cast<double>(base[d] - row[d]) * g[d];
        gg += static_cast<double>(g[d]) * g[d];
      }
      const double r = gg > 0 ? dot / gg : 0;
      tab.rate[s] = std::isfinite(r) && r > 0 ? static_cast<float>(r) : 0.0f;
    }
    std::memcpy(base, row, sizeof(float) * tab.dim);
    float* values = tab.part(s, kValues);
    std::memcpy(values, row, sizeof(float) * tab.dim);
    if (tab.has_gathered[s] && tab.rate[s] > 0) {  // the worker's own updates the ps has not seen yet
      const float* acc = tab.part(s, kGathered);
      for (int d = 0; d < tab.dim; ++d) values[d] -= tab.rate[s] * acc[d];
    }
    std::memcpy(rows + static_cast<size_t>(pos) * tab.dim, values, sizeof(float) * tab.dim);
    tab.pulled[s] = step;
  }
}

void RowCache::Gradients(int t, const std::vector<int64_t>& ids, const Plan& plan, const float* grads,
                         std::vector<int64_t>* push_ids, std::vector<float>* push_grads) {
  Table& tab = tables_[t];
  push_ids->clear();
  push_grads->clear();
  for (size_t i = 0; i < ids.size() && i < kAhead; ++i) Prefetch(tab, plan.slot[i]);
  for (size_t i = 0; i < ids.size(); ++i) {
    if (i + kAhead < ids.size()) Prefetch(tab, plan.slot[i + kAhead]);
    const float* g = grads + i * tab.dim;
    const int32_t s = SlotOf(tab, plan.slot[i], ids[i]);
    if (plan.cached[i] && s >= 0) {  // served from the cache: gathered until the row is pulled again
      float* acc = tab.part(s, kGathered);
      for (int k = 0; k < tab.dim; ++k) acc[k] += g[k];
      tab.has_gathered[s] = 1;
      // The worker's own update of its copy, at the step size the ps applied to the row's last push.
      const float r = tab.rate[s];
      if (r > 0) {
        float* v = tab.part(s, kValues);
        for (int k = 0; k < tab.dim; ++k) v[k] -= r * g[k];
      }
      continue;
    }
    push_ids->push_back(ids[i]);
    const size_t at = push_grads->size();
    push_grads->insert(push_grads->end(), g, g + tab.dim);
    if (s >= 0 && tab.has_gathered[s]) {  // pulled again: what it gathered goes with this step
      float* acc = tab.part(s, kGathered);
      for (int k = 0; k < tab.dim; ++k) (*push_grads)[at + k] += acc[k];
      std::fill_n(acc, tab.dim, 0.0f);
      tab.has_gathered[s] = 0;
    }
    auto orphan = tab.orphans.find(ids[i]);
    if (orphan != tab.orphans.end()) {
      for (int k = 0; k < tab.dim; ++k) (*push_grads)[at + k] += orphan->second[k];
      tab.orphans.erase(orphan);
    }
    if (s >= 0) {
      std::copy_n(push_grads->begin() + at, tab.dim, tab.part(s, kLastPush));
      tab.has_last_push[s] = 1;
      // The copy the next steps are served: as the ps will hold it once it applies this push (the gathered part
      // was applied to it when it was stored).
      const float r = tab.rate[s];
      if (r > 0) {
        float* v = tab.part(s, kValues);
        for (int k = 0; k < tab.dim; ++k) v[k] -= r * g[k];
      }
    }
  }
  // Rows that left the cache with gathered gradients and are not in this step: pushed on their own.
  for (auto& [id, g] : tab.orphans) {
    push_ids->push_back(id);
    push_grads->insert(push_grads->end(), g.begin(), g.end());
  }
  tab.orphans.clear();
}

}  // namespace dtrain::worker
