// Placeholder: the activation ops family is being written.
#include "ops/op.h"
