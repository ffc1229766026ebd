# Writes a C++ source that defines `absl::string_view <FUNCTION>()` returning the bytes of IN, as
# a raw string literal: cmake -DIN=<file> -DOUT=<file.cc> -DFUNCTION=<qualified name>
#                            -DHEADER=<include path> -P embed_file.cmake
# Used for the dashboard page, so that it stays an editable file and the binary self-contained.
file(READ "${IN}" content)
set(delimiter "moetrain_embed")
string(FIND "${content}" ")${delimiter}\"" clash)
if(NOT clash EQUAL -1)
  message(FATAL_ERROR "${IN} contains )${delimiter}\" and cannot be embedded as a raw string")
endif()
string(REGEX REPLACE "::[^:]*$" "" namespace "${FUNCTION}")
string(REGEX REPLACE "^.*::" "" name "${FUNCTION}")
file(WRITE "${OUT}.tmp"
  "// Generated from ${IN} by embed_file.cmake; edit that file instead.\n"
  "#include \"${HEADER}\"\n\n"
  "namespace ${namespace} {\n\n"
  "absl::string_view ${name}() {\n"
  "  static constexpr char kText[] = R\"${delimiter}(${content})${delimiter}\";\n"
  "  return absl::string_view(kText, sizeof(kText) - 1);\n"
  "}\n\n"
  "}  // namespace ${namespace}\n")
# Rewritten only when it changed, so an unchanged page does not recompile anything.
file(COPY_FILE "${OUT}.tmp" "${OUT}" ONLY_IF_DIFFERENT)
file(REMOVE "${OUT}.tmp")
