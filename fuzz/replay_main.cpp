// A main() for a fuzz harness without libFuzzer: runs LLVMFuzzerTestOneInput once on every
// file named on the command line (a folder: every file in it, sorted). The C++ tests use it
// to replay the committed corpus and crashers under AddressSanitizer and UBSan.
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <string>
#include <vector>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);

namespace fs = std::filesystem;

static std::vector<uint8_t> read_all(const fs::path& p) {
    std::ifstream f(p, std::ios::binary);
    return {std::istreambuf_iterator<char>(f), std::istreambuf_iterator<char>()};
}

int main(int argc, char** argv) {
    std::vector<fs::path> files;
    for (int i = 1; i < argc; ++i) {
        const fs::path arg = argv[i];
        if (fs::is_directory(arg)) {
            for (const auto& e : fs::directory_iterator(arg))
                if (e.is_regular_file()) files.push_back(e.path());
        } else if (fs::exists(arg)) {
            files.push_back(arg);
        } else {  // a target without crashers has no folder for them
            std::fprintf(stderr, "%s: no such file or folder, skipped\n", argv[i]);
        }
    }
    std::sort(files.begin(), files.end());
    for (const fs::path& p : files) {
        const std::vector<uint8_t> data = read_all(p);
        std::fprintf(stderr, "%s (%zu bytes)\n", p.c_str(), data.size());
        // An empty vector's data() may be null; libFuzzer passes a valid pointer.
        static const uint8_t none = 0;
        LLVMFuzzerTestOneInput(data.empty() ? &none : data.data(), data.size());
    }
    std::printf("%zu inputs replayed\n", files.size());
    return files.empty() ? 1 : 0;  // no input at all: the corpus is missing
}
