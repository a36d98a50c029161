// plasma/test_util.h: the helpers Plasma's tests (and many of its users'
// tests) used, for ferroplasma's Plasma compatibility headers.
#ifndef FERROPLASMA_PLASMA_TEST_UTIL_H
#define FERROPLASMA_PLASMA_TEST_UTIL_H

#include <sys/wait.h>

#include <cstring>

#include "ferroplasma.h"
#include "plasma/common.h"

namespace plasma {

/// A random id (from the operating system's random source: unlike Plasma's,
/// which seeded a generator with 0, 1, 2, ... in every process, two
/// processes never draw the same ids).
inline ObjectID random_object_id() {
  fp_object_id raw = fp_object_id_random();
  ObjectID id;
  std::memcpy(id.mutable_data(), raw.bytes, sizeof(raw.bytes));
  return id;
}

#define PLASMA_CHECK_SYSTEM(expr)        \
  do {                                   \
    int status__ = (expr);               \
    EXPECT_TRUE(WIFEXITED(status__));    \
    EXPECT_EQ(WEXITSTATUS(status__), 0); \
  } while (false);

}  // namespace plasma

#endif  // FERROPLASMA_PLASMA_TEST_UTIL_H
