# Data-parallel backends for engine/distributed (docs/DISTRIBUTED.md). Sets ENGINE_HAS_MPI and ENGINE_HAS_NCCL
# and defines engine_distributed_sources().
#   MPI   ENGINE_MPI=AUTO (when found), ON (required: CI, through scripts/test.sh) or OFF. Without it the
#         communicator's mpi backend throws "built without MPI", and find_package(engine) users need no MPI.
#   NCCL  only in real CUDA builds (nvcc), when libnccl and nccl.h are found and MPI is there to bootstrap it;
#         never in ENGINE_CUDA=EMULATE, since the emulated device has no NCCL.
set(ENGINE_MPI "AUTO" CACHE STRING "Build the MPI communicator backend: AUTO (when found), ON or OFF")
set_property(CACHE ENGINE_MPI PROPERTY STRINGS AUTO ON OFF)
set(ENGINE_HAS_MPI OFF)
set(ENGINE_HAS_NCCL OFF)
# MPI's C API through the C++ compiler (the project enables no C), without the deprecated C++ bindings.
set(MPI_CXX_SKIP_MPICXX ON CACHE BOOL "libengine uses MPI's C API only")
if(NOT ENGINE_MPI STREQUAL "OFF")
  if(ENGINE_MPI STREQUAL "ON")
    find_package(MPI REQUIRED COMPONENTS CXX)
  else()
    find_package(MPI QUIET COMPONENTS CXX)
  endif()
  if(MPI_CXX_FOUND)
    set(ENGINE_HAS_MPI ON)
  endif()
endif()
if(ENGINE_HAS_MPI AND ENGINE_HAS_CUDA AND NOT ENGINE_CUDA_EMULATED)
  find_path(ENGINE_NCCL_INCLUDE nccl.h HINTS ${CUDAToolkit_INCLUDE_DIRS} ${CUDAToolkit_LIBRARY_ROOT}/include)
  find_library(ENGINE_NCCL_LIBRARY nccl HINTS ${CUDAToolkit_LIBRARY_DIR} ${CUDAToolkit_LIBRARY_ROOT}/lib
               ${CUDAToolkit_LIBRARY_ROOT}/lib64)
  if(ENGINE_NCCL_INCLUDE AND ENGINE_NCCL_LIBRARY)
    set(ENGINE_HAS_NCCL ON)
  endif()
endif()
message(STATUS "libengine: communicator backends: none, mpi ${ENGINE_HAS_MPI}, nccl ${ENGINE_HAS_NCCL}")

# Adds the communicator's sources to `target` and links the backends found. The ENGINE_HAS_MPI/NCCL
# definitions are on these sources only: the rest of the engine asks backend_built() at run time, so that
# switching a backend rebuilds four files, not the engine.
function(engine_add_distributed target)
  set(directory ${PROJECT_SOURCE_DIR}/engine/distributed)
  set(sources ${directory}/communicator.cpp)
  if(ENGINE_HAS_MPI)
    list(APPEND sources ${directory}/mpi_communicator.cpp)
    target_link_libraries(${target} PRIVATE MPI::MPI_CXX)
  endif()
  if(ENGINE_HAS_NCCL)
    list(APPEND sources ${directory}/nccl_communicator.cpp)
    target_include_directories(${target} PRIVATE ${ENGINE_NCCL_INCLUDE})
    target_link_libraries(${target} PRIVATE ${ENGINE_NCCL_LIBRARY})
  endif()
  target_sources(${target} PRIVATE ${sources})
  set_source_files_properties(${sources} PROPERTIES COMPILE_DEFINITIONS
    "ENGINE_HAS_MPI=$<BOOL:${ENGINE_HAS_MPI}>;ENGINE_HAS_NCCL=$<BOOL:${ENGINE_HAS_NCCL}>")
endfunction()
