// Placeholder: the dropout embedding ops family is being written.
#include "ops/op.h"
