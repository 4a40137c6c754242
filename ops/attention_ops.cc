// Placeholder: the attention ops family is being written.
#include "ops/op.h"
