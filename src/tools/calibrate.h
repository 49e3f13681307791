// Calibration for the EXL3 quantizer: runs token ids through the float model on the CPU backend and
// accumulates, for every named linear, H = (1/n) Σ xᵀx over the n input rows it saw (double, [in, in]).
// Experts only see the tokens routed to them; a linear that saw nothing gets no entry (no LDLQ). A model
// with an MTP block also runs it over the same tokens (teacher-forced pairs), so its linears get Hessians.
// Memory: in² doubles per named linear.
#pragma once
#include <cstdint>
#include <map>
#include <string>
#include <vector>

namespace lily {

// Token ids from a file: non-negative integers separated by commas and/or white space.
std::vector<int32_t> read_token_file(const std::string& path);

std::map<std::string, std::vector<double>> capture_hessians(const std::string& model_dir, const std::string& tokens_file,
                                                            int64_t max_tokens, const std::vector<std::string>& names);

}  // namespace lily
