# The layers of csrc/ and the one rule between them: a file includes headers
# of its own layer and of the layers below it, never of a layer above or
# beside it:
#   common -> topology | kernels -> transport -> algorithms -> backend
# The build runs this before compiling anything (CMakeLists.txt), so an
# include that goes up fails the build. Also runnable alone:
#   cmake -DROOT=<repo> [-DSTAMP=<file touched on success>] -P cmake/check_layers.cmake
set(rank_common 0)
set(rank_topology 1)
set(rank_kernels 1)
set(rank_transport 2)
set(rank_algorithms 3)
set(rank_backend 4)

if(NOT ROOT)
  message(FATAL_ERROR "check_layers: pass -DROOT=<the repository>")
endif()
file(GLOB_RECURSE sources "${ROOT}/csrc/*.h" "${ROOT}/csrc/*.cpp" "${ROOT}/csrc/*.cu"
     "${ROOT}/csrc/*.cuh")
set(problems "")
foreach(path ${sources})
  file(RELATIVE_PATH rel "${ROOT}/csrc" "${path}")
  string(REGEX MATCH "^[a-z_]+" layer "${rel}")
  if(NOT DEFINED rank_${layer})
    continue()
  endif()
  file(STRINGS "${path}" includes REGEX "^[ \t]*#[ \t]*include[ \t]*\"[a-z_]+/")
  foreach(line ${includes})
    string(REGEX REPLACE "^[ \t]*#[ \t]*include[ \t]*\"([a-z_]+)/([^\"]*)\".*" "\\1;\\2" parts
           "${line}")
    list(GET parts 0 to)
    list(GET parts 1 header)
    if(to STREQUAL layer OR NOT DEFINED rank_${to})
      continue()
    endif()
    if(NOT rank_${to} LESS rank_${layer})
      string(APPEND problems "\n  csrc/${rel} (${layer}) includes ${to}/${header}")
    endif()
  endforeach()
endforeach()
if(problems)
  message(FATAL_ERROR "smdccl: includes that go up or across the layers "
                      "(common -> topology | kernels -> transport -> algorithms -> backend):"
                      "${problems}\nMove the shared type down to a layer both may include.")
endif()
if(STAMP)
  file(TOUCH "${STAMP}")
endif()
