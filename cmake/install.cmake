# Installs headers, the library and engineConfig.cmake so that find_package(engine CONFIG) works.
include(GNUInstallDirs)
include(CMakePackageConfigHelpers)

install(TARGETS engine EXPORT engineTargets
  ARCHIVE DESTINATION ${CMAKE_INSTALL_LIBDIR}
  LIBRARY DESTINATION ${CMAKE_INSTALL_LIBDIR}
  INCLUDES DESTINATION include/libengine)
install(FILES libengine.h DESTINATION include/libengine) # the umbrella, above every room
set(ENGINE_HEADER_DIRS base engine kernels nn optim checkpoint planner)
if(ENGINE_CUDA_EMULATED)
  list(APPEND ENGINE_HEADER_DIRS emulator) # base/cuda/headers.h includes it in that mode
endif()
foreach(header_dir ${ENGINE_HEADER_DIRS})
  install(DIRECTORY ${header_dir} DESTINATION include/libengine FILES_MATCHING PATTERN "*.h" PATTERN "*.cuh")
endforeach()
install(EXPORT engineTargets NAMESPACE engine:: DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/engine)
configure_package_config_file(cmake/engineConfig.cmake.in ${CMAKE_CURRENT_BINARY_DIR}/engineConfig.cmake
  INSTALL_DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/engine)
write_basic_package_version_file(${CMAKE_CURRENT_BINARY_DIR}/engineConfigVersion.cmake
  COMPATIBILITY SameMinorVersion)
install(FILES ${CMAKE_CURRENT_BINARY_DIR}/engineConfig.cmake ${CMAKE_CURRENT_BINARY_DIR}/engineConfigVersion.cmake
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/cmake/engine)
