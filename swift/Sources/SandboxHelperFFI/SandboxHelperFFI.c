// SwiftPM builds a C target only if it has a source file: this one. The functions behind the
// headers are the Rust static library's (linked by Package.swift's linker settings).
#include "SandboxHelperFFI.h"
