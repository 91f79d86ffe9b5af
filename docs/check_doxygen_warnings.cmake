# Fails the docs build on Doxygen warnings that point at code:
# - API_LOG (the public headers alone, EXTRACT_ALL off): every warning, undocumented entities included;
# - SITE_LOG (the whole site): every warning in a source file (.cu/.cuh/.cpp/.hpp/.h), e.g. a broken
#   @param or an unknown command. Warnings about Markdown pages are printed and tolerated: their links
#   are checked by docs/doxygen_links.py.
set(fatal 0)
foreach(log IN ITEMS "${API_LOG}" "${SITE_LOG}")
  if(NOT EXISTS "${log}")
    continue()
  endif()
  file(STRINGS "${log}" lines)
  foreach(line IN LISTS lines)
    if(log STREQUAL API_LOG AND line MATCHES "warning" OR line MATCHES "\\.(cu|cuh|cpp|hpp|h):[0-9]+: warning")
      message("${line}")
      math(EXPR fatal "${fatal} + 1")
    elseif(line MATCHES "warning")
      message(STATUS "(page, tolerated) ${line}")
    endif()
  endforeach()
endforeach()
if(fatal GREATER 0)
  message(FATAL_ERROR "${fatal} Doxygen warning(s) in the code's documentation")
endif()
message(STATUS "Doxygen: public headers fully documented, no warnings in the sources")
