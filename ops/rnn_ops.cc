// Placeholder: the rnn ops family is being written.
#include "ops/op.h"
