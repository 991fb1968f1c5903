// Writes a random-weight GGUF of a given shape (being written).
int main() { return 0; }
