// MPI backend tests, run by mpirun with 2 and 4 ranks (tests/cmake/mpi.cmake).
#include <gtest/gtest.h>

#include "megackpt/process_group.h"

namespace megackpt {
namespace {

TEST(MpiProcessGroup, Basics) {
  auto group = NewMpiProcessGroup();
  ASSERT_TRUE(group.ok()) << group.status().ToString();
  EXPECT_EQ((*group)->backend(), "mpi");
  EXPECT_TRUE((*group)->Barrier().ok());
}

}  // namespace
}  // namespace megackpt
