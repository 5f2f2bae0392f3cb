// set_data_ipc / share_external_data / unset_data_ipc in the framework-free module.
#pragma once

#include <pybind11/pybind11.h>

namespace fdmtp {
namespace pybind {

void DefineIpc(pybind11::module_& m);

}  // namespace pybind
}  // namespace fdmtp
