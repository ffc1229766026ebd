// Stands in for the sources of an engine folder that has none yet (see engine/CMakeLists.txt).
