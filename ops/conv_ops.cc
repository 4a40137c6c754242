// Placeholder: the conv ops family is being written.
#include "ops/op.h"
