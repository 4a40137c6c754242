// Placeholder: the reduce ops family is being written.
#include "ops/op.h"
