// The local-directory backend against the backend conformance suite.
#include "cas/backend_conformance.h"

namespace megackpt::cas::testing {
namespace {

INSTANTIATE_TEST_SUITE_P(
    Local, CasBackendConformanceTest,
    ::testing::Values(BackendFactory{"local",
                                     [](const std::string& dir) {
                                       return OpenLocalBackend(dir, {.create = true, .sync = false});
                                     }},
                      BackendFactory{"local_sync",
                                     [](const std::string& dir) {
                                       return OpenLocalBackend(dir, {.create = true, .sync = true});
                                     }}),
    BackendFactoryName);

}  // namespace
}  // namespace megackpt::cas::testing
