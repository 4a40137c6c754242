// Placeholder: the norm ops family is being written.
#include "ops/op.h"
