// -e: backslash escapes in prompt text as llama.cpp's string_process_escapes
// reads them: \n \r \t \\ \" \' and \xHH (two hex digits); any other
// backslash sequence is kept as it is.
#pragma once

#include <string>

namespace runlm {

std::string process_escapes(const std::string& text);

}  // namespace runlm
