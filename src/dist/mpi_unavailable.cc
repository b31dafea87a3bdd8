// The MPI backend in a build without MPI (MEGACKPT_WITH_MPI=OFF): the single
// process and threads groups work as usual; an MPI group cannot be made.
#include "megackpt/dist/process_group.h"

namespace megackpt::dist {

Result<std::unique_ptr<ProcessGroup>> NewMpiProcessGroup(ProcessGroupOptions options) {
  (void)options;
  return UnimplementedError(
      "this megackpt was built without MPI (MEGACKPT_WITH_MPI=OFF); "
      "use the single-process or threads group");
}

}  // namespace megackpt::dist
