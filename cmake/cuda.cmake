# CUDA backend selection for ENGINE_CUDA=AUTO|ON|OFF|EMULATE. Sets ENGINE_HAS_CUDA and ENGINE_CUDA_EMULATED and
# defines engine_configure_cuda_target().
#   AUTO/ON  kernels/cuda/*.cu through nvcc, linked against cudart, cuBLAS and cuBLASLt (AUTO: when nvcc is found)
#   EMULATE  the same sources compiled as host C++ against the emulated device in emulator/ (docs/CUDA.md):
#            the toolkit's headers only, no libcudart, libcublas or libcublasLt (emulator/*.cpp, cublaslt.cpp
#            among them, implement what the engine calls); Boost.Context for the thread fibers
set(ENGINE_HAS_CUDA OFF)
set(ENGINE_CUDA_EMULATED OFF)
if(ENGINE_CUDA STREQUAL "EMULATE")
  find_package(CUDAToolkit REQUIRED) # for its include directory
  find_package(Boost 1.74 REQUIRED COMPONENTS context)
  set(ENGINE_HAS_CUDA ON)
  set(ENGINE_CUDA_EMULATED ON)
elseif(NOT ENGINE_CUDA STREQUAL "OFF")
  include(CheckLanguage)
  if(NOT DEFINED CMAKE_CUDA_ARCHITECTURES)
    set(CMAKE_CUDA_ARCHITECTURES 90)
  endif()
  check_language(CUDA)
  if(CMAKE_CUDA_COMPILER)
    enable_language(CUDA)
    find_package(CUDAToolkit REQUIRED)
    # CMake before 3.26 has no C++20 flag for nvcc, though nvcc >= 12 accepts -std=c++20; without these the
    # engine's cxx_std_20 requirement fails to generate for its .cu sources.
    if(NOT DEFINED CMAKE_CUDA20_STANDARD_COMPILE_OPTION AND CMAKE_CUDA_COMPILER_VERSION VERSION_GREATER_EQUAL 12.0)
      set(CMAKE_CUDA20_STANDARD_COMPILE_OPTION "-std=c++20")
      set(CMAKE_CUDA20_EXTENSION_COMPILE_OPTION "-std=c++20")
    endif()
    set(ENGINE_HAS_CUDA ON)
  elseif(ENGINE_CUDA STREQUAL "ON")
    message(FATAL_ERROR "ENGINE_CUDA=ON but no CUDA compiler (nvcc) was found")
  endif()
endif()
message(STATUS "libengine: CUDA backend ${ENGINE_HAS_CUDA}, emulated ${ENGINE_CUDA_EMULATED} "
               "(ENGINE_CUDA=${ENGINE_CUDA}, architectures ${CMAKE_CUDA_ARCHITECTURES})")

# Sources of the CUDA backend for this mode, into the variable `out`.
function(engine_cuda_sources out)
  file(GLOB sources CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/engine/cuda/*.cpp ${PROJECT_SOURCE_DIR}/kernels/cuda/*.cu)
  list(FILTER sources EXCLUDE REGEX "/engine/cuda/absent\\.cpp$") # the stubs of builds without CUDA
  if(ENGINE_CUDA_EMULATED)
    file(GLOB emulator CONFIGURE_DEPENDS ${PROJECT_SOURCE_DIR}/emulator/*.cpp)
    list(APPEND sources ${emulator})
  endif()
  set(${out} ${sources} PARENT_SCOPE)
endfunction()

# Compiles `target`'s .cu files as CUDA, or as host C++ for the emulated device. Call it from the directory
# that creates the target (source properties are per directory).
function(engine_configure_cuda_target target)
  if(ENGINE_CUDA_EMULATED)
    get_target_property(sources ${target} SOURCES)
    list(FILTER sources INCLUDE REGEX "\\.cu$")
    if(sources)
      set_source_files_properties(${sources} PROPERTIES LANGUAGE CXX)
    endif()
    target_include_directories(${target} SYSTEM PUBLIC ${CUDAToolkit_INCLUDE_DIRS})
    target_link_libraries(${target} PUBLIC Boost::context)
    return()
  endif()
  set(CMAKE_CUDA_STANDARD 20)
  set_target_properties(${target} PROPERTIES CUDA_STANDARD 20 CUDA_STANDARD_REQUIRED ON
                                             CUDA_SEPARABLE_COMPILATION OFF)
  target_link_libraries(${target} PUBLIC CUDA::cudart CUDA::cublas CUDA::cublasLt)
endfunction()
