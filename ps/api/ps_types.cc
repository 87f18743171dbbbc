#include "ps/api/ps_types.h"

namespace dtrain::ps {

bool OptimizerConfig::operator==(const OptimizerConfig& o) const {
  return name == o.name && learning_rate == o.learning_rate && decay_steps == o.decay_steps &&
         decay_rate == o.decay_rate && staircase == o.staircase && momentum == o.momentum && beta1 == o.beta1 &&
         beta2 == o.beta2 && epsilon == o.epsilon;
}

}  // namespace dtrain::ps
