// For the metrics tests: a fresh, empty directory per test case.
#pragma once

#include <string>

namespace loom::metrics::testing {

// <TEST_TMPDIR or the system temp folder>/<name>, emptied if it exists.
std::string FreshTestDir(const std::string& name);

}  // namespace loom::metrics::testing
