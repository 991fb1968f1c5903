// runlm entry point (subcommand dispatch is being written).
#include <cstdio>
int main() { std::puts("runlm"); return 0; }
