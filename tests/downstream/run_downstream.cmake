# Installs libengine into a temporary prefix, then configures, builds and runs a separate project that
# uses find_package(engine CONFIG REQUIRED), builds the examples in it and runs them. Run by ctest as `cmake -P`.
file(REMOVE_RECURSE ${WORK_DIR})
set(prefix ${WORK_DIR}/prefix)
execute_process(COMMAND ${CMAKE_COMMAND} --install ${ENGINE_BINARY_DIR} --prefix ${prefix}
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "cmake --install failed: ${result}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} -S ${DOWNSTREAM_SOURCE_DIR} -B ${WORK_DIR}/build -G ${CMAKE_GENERATOR}
  -DCMAKE_PREFIX_PATH=${prefix} -DCMAKE_BUILD_TYPE=Release -DENGINE_EXAMPLES_DIR=${EXAMPLES_SOURCE_DIR}
  RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "downstream configure failed: ${result}")
endif()
execute_process(COMMAND ${CMAKE_COMMAND} --build ${WORK_DIR}/build RESULT_VARIABLE result)
if(NOT result EQUAL 0)
  message(FATAL_ERROR "downstream build failed: ${result}")
endif()
execute_process(COMMAND ${WORK_DIR}/build/downstream_demo RESULT_VARIABLE result OUTPUT_VARIABLE output)
message(STATUS "downstream_demo said: ${output}")
if(NOT result EQUAL 0)
  message(FATAL_ERROR "downstream_demo failed: ${result}")
endif()
if(NOT output MATCHES "downstream ok")
  message(FATAL_ERROR "downstream_demo did not report success")
endif()
# The examples, built against the installed package: each exits 0 only if its loss fell (checkpointed_model
# also needs its offload to have happened and its gradients to match the plain model's).
foreach(example custom_mlp checkpointed_model)
  execute_process(COMMAND ${WORK_DIR}/build/examples/example_${example} RESULT_VARIABLE result OUTPUT_VARIABLE output)
  string(REGEX MATCH "[^\n]*held-out loss [^\n]*->[^\n]*" summary "${output}")
  message(STATUS "example_${example} said: ${summary}")
  if(NOT result EQUAL 0)
    message(FATAL_ERROR "example_${example} against the installed package failed (${result}):\n${output}")
  endif()
endforeach()
