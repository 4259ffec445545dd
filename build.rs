//! Links the `vramlab` binary as a position-dependent executable on Linux with the GNU
//! toolchain (`-no-pie`): a position-independent one makes the dynamic loader apply its
//! 49 000 relative relocations (a 40 MB binary that links the GUI) at every start, writing
//! to about 200 pages of pointers. Without them `vramlab --version` runs 1.70 M instructions
//! instead of 2.34 M and takes 250 page faults instead of 456 (about 0.8 ms of each command,
//! `docs/speed.md`, session 26). The code is compiled position-independent as before; only
//! the binary is linked at a fixed address (its own load address is then not randomized;
//! the libraries' and the stack's still are).

fn main() {
    println!("cargo::rerun-if-changed=build.rs");
    let os = std::env::var("CARGO_CFG_TARGET_OS").unwrap_or_default();
    let env = std::env::var("CARGO_CFG_TARGET_ENV").unwrap_or_default();
    if os == "linux" && env == "gnu" {
        println!("cargo::rustc-link-arg-bin=vramlab=-no-pie");
    }
}
