// Placeholder: the shape ops family is being written.
#include "ops/op.h"
