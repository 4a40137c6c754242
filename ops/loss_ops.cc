// Placeholder: the loss ops family is being written.
#include "ops/op.h"
