// Placeholder: the pool ops family is being written.
#include "ops/op.h"
