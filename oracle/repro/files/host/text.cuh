// host/text.cuh -- reading the reproducer's text files: one strict line grammar (key=value words).
// Part of the reproducer's host program (repro.cu); nothing here depends on the case.
#pragma once

#include "common.cuh"

namespace repro {

// ------------------------------------------------------------------------------ text files

struct Line {
  int number;
  std::vector<std::string> tokens;
};

constexpr long long kMaxTextBytes = 64ll << 20;  // a text file of the folder; the oracle's are far smaller

// Lines of whitespace-separated tokens; '#' starts a comment; blank lines are skipped. A control
// character other than a tab (a carriage return, a NUL, an escape) is refused, not read around.
// The file is a regular one of at most kMaxTextBytes (open_regular), read whole before parsing.
std::vector<Line> read_lines(const std::string& path) {
  struct stat st;
  const int fd = open_regular(path, "a text file of the reproducer's directory (--dir DIR)", &st);
  if (st.st_size > kMaxTextBytes) {
    ::close(fd);
    fail(path + " has " + std::to_string((long long)st.st_size) + " bytes, more than the " +
         std::to_string(kMaxTextBytes >> 20) + " MiB a reproducer's text file may have");
  }
  std::string all(size_t(st.st_size), '\0');
  read_exactly(fd, &all[0], all.size(), path);
  ::close(fd);
  std::istringstream in(all);
  std::vector<Line> out;
  std::string text;
  int no = 0;
  while (std::getline(in, text)) {
    ++no;
    for (unsigned char c : text)
      if ((c < 0x20 && c != '\t') || c == 0x7f)
        fail(path + ":" + std::to_string(no) + ": control character " + std::to_string(int(c)) +
             " in a line; the oracle writes none");
    const auto hash = text.find('#');
    if (hash != std::string::npos) text.resize(hash);
    std::istringstream ss(text);
    Line l{no, {}};
    std::string t;
    while (ss >> t) l.tokens.push_back(t);
    if (!l.tokens.empty()) out.push_back(l);
  }
  return out;
}

std::string where(const std::string& path, const Line& l) { return path + ":" + std::to_string(l.number); }

// Value i of a key line (its key is token 0; `at` is where the line stands): a line without it is
// refused, naming the key and how many values it needs.
const std::string& key_value(const Line& l, size_t i, const std::string& at) {
  if (l.tokens.size() <= i) fail(at + ": " + l.tokens[0] + " needs " + std::to_string(i) + " value(s)");
  return l.tokens[i];
}

// The names the oracle writes (harness/names.py): an entry point or tensor is a C identifier, a
// file a plain name of letters, digits and _ . + - not starting with '.' or '-' (no folder, no '..').
bool is_identifier(const std::string& s) {
  if (s.empty() || s.size() > 1024 || !(std::isalpha((unsigned char)s[0]) || s[0] == '_')) return false;
  for (unsigned char c : s)
    if (!(std::isalnum(c) || c == '_')) return false;
  return true;
}

bool is_file_name(const std::string& s) {
  if (s.empty() || s.size() > 255 || !(std::isalnum((unsigned char)s[0]) || s[0] == '_')) return false;
  for (unsigned char c : s)
    if (!(std::isalnum(c) || c == '_' || c == '.' || c == '+' || c == '-')) return false;
  return true;
}

const std::string& identifier(const std::string& s, const std::string& at, const std::string& what) {
  if (!is_identifier(s)) fail(at + ": " + what + " '" + s + "' is not a C identifier");
  return s;
}

const std::string& file_name(const std::string& s, const std::string& at, const std::string& what) {
  if (!is_file_name(s)) fail(at + ": " + what + " '" + s + "' is not a plain file name of this directory");
  return s;
}

long long to_int(const std::string& s, const std::string& at) {
  char* end = nullptr;
  errno = 0;
  const long long v = std::strtoll(s.c_str(), &end, 0);
  if (s.empty() || *end != '\0' || errno) fail(at + ": '" + s + "' is not an integer");
  return v;
}

unsigned long long to_uint(const std::string& s, const std::string& at) {
  char* end = nullptr;
  errno = 0;
  const unsigned long long v = std::strtoull(s.c_str(), &end, 0);
  if (s.empty() || s[0] == '-' || *end != '\0' || errno) fail(at + ": '" + s + "' is not an unsigned integer");
  return v;
}

double to_double(const std::string& s, const std::string& at) {  // decimal or C99 hex float
  char* end = nullptr;
  const double v = std::strtod(s.c_str(), &end);
  if (s.empty() || *end != '\0') fail(at + ": '" + s + "' is not a number");
  return v;
}

std::vector<std::string> split(const std::string& s, char sep) {
  std::vector<std::string> out;
  std::string cur;
  for (char c : s) {
    if (c == sep) {
      out.push_back(cur);
      cur.clear();
    } else {
      cur += c;
    }
  }
  out.push_back(cur);
  return out;
}

// key=value tokens of a line, from token `first` on.
std::map<std::string, std::string> pairs(const Line& l, size_t first, const std::string& at) {
  std::map<std::string, std::string> kv;
  for (size_t i = first; i < l.tokens.size(); ++i) {
    const auto eq = l.tokens[i].find('=');
    if (eq == std::string::npos) fail(at + ": '" + l.tokens[i] + "' is not key=value");
    kv[l.tokens[i].substr(0, eq)] = l.tokens[i].substr(eq + 1);
  }
  return kv;
}

std::string need(const std::map<std::string, std::string>& kv, const std::string& key, const std::string& at) {
  auto it = kv.find(key);
  if (it == kv.end()) fail(at + ": missing " + key + "=...");
  return it->second;
}

}  // namespace repro
