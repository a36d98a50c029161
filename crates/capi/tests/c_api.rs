//! The C library from C: every call and its error paths (tests/c/test_api.c)
//! against a real store, and a C program killed while it holds objects.

mod common;

use common::{build, crate_dir, Store};
use ferroplasma_client::ObjectId;
use std::io::{BufRead, BufReader};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn test_api() -> std::path::PathBuf {
    build(
        "cc",
        "test_api",
        &[&crate_dir().join("tests/c/test_api.c")],
        &["-std=c11"],
    )
}

#[test]
fn every_call_and_its_error_paths_from_c() {
    let store = Store::start("calls", 16 << 20);
    let out = Command::new(test_api())
        .arg(&store.socket)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "test_api failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "ok");
}

#[test]
fn connecting_without_a_store_is_a_clear_error() {
    let missing = std::env::temp_dir().join(format!("fp-capi-none-{}.sock", std::process::id()));
    let out = Command::new(test_api())
        .arg(&missing)
        .arg("nostore")
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        text.contains(&*missing.to_string_lossy()),
        "the error names the socket: {text}"
    );
}

/// A C program SIGKILLed while it holds objects leaves nothing held: the
/// deferred delete completes and the store's memory is free again.
#[test]
fn a_c_program_killed_while_holding_objects_leaves_nothing_held() {
    let store = Store::start("kill", 16 << 20);
    let c = store.client();
    let id = ObjectId::random();
    c.put(id, &[42u8; 4096], b"").unwrap();
    let mut child = Command::new(test_api())
        .arg(&store.socket)
        .arg("hold")
        .arg(id.to_hex())
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let mut line = String::new();
    BufReader::new(child.stdout.take().unwrap())
        .read_line(&mut line)
        .unwrap();
    assert_eq!(line.trim(), "held 42");
    assert_eq!(
        c.delete(&[id]).unwrap(),
        vec![ferroplasma_client::DeleteStatus::Deferred],
        "held by the C program"
    );
    child.kill().unwrap();
    child.wait().unwrap();
    let t = Instant::now();
    loop {
        let s = c.stats().unwrap();
        if s.objects == 0 && s.used == 0 {
            break;
        }
        assert!(t.elapsed() < Duration::from_secs(10), "still held: {s:?}");
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// Plasma-style C++ (tests/cpp/test_plasma_shape.cpp) through ferroplasma.hpp.
#[test]
fn plasma_shaped_cpp_runs_against_the_store() {
    let store = Store::start("cpp", 16 << 20);
    let prog = build(
        "c++",
        "test_plasma_shape",
        &[&crate_dir().join("tests/cpp/test_plasma_shape.cpp")],
        &["-std=c++17"],
    );
    let out = Command::new(prog).arg(&store.socket).output().unwrap();
    assert!(
        out.status.success(),
        "test_plasma_shape failed:\n{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// The code blocks of docs/languages.md, as written, compile and run.
#[test]
fn the_examples_in_docs_languages_md_work() {
    let doc = std::fs::read_to_string(crate_dir().join("../../docs/languages.md")).unwrap();
    let block = |lang: &str| {
        let start = doc.find(&format!("```{lang}\n")).expect("a code block") + lang.len() + 4;
        doc[start..start + doc[start..].find("```").unwrap()].to_string()
    };
    let store = Store::start("docs", 16 << 20);
    for (lang, compiler, std) in [("c", "cc", "-std=c11"), ("cpp", "c++", "-std=c++17")] {
        let src = std::env::temp_dir().join(format!("fp-capi-{}-doc.{lang}", std::process::id()));
        std::fs::write(&src, block(lang)).unwrap();
        let prog = build(compiler, &format!("doc-{lang}"), &[&src], &[std]);
        let out = Command::new(prog).arg(&store.socket).output().unwrap();
        assert!(
            out.status.success(),
            "{lang}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(text.starts_with("hello"), "{lang} printed {text:?}");
    }
}

/// The README's C example, as written, reads an object by its id.
#[test]
fn the_readme_c_example_works() {
    let readme = std::fs::read_to_string(crate_dir().join("../../README.md")).unwrap();
    let start = readme.find("```c\n").expect("a C block") + 5;
    let src = std::env::temp_dir().join(format!("fp-capi-{}-readme.c", std::process::id()));
    std::fs::write(
        &src,
        &readme[start..start + readme[start..].find("```").unwrap()],
    )
    .unwrap();
    let prog = build("cc", "readme", &[&src], &["-std=c11"]);
    let store = Store::start("readme", 16 << 20);
    let id = ObjectId::random();
    store.client().put(id, &[7u8; 1000], b"").unwrap();
    let out = Command::new(prog)
        .arg(id.to_hex())
        .env("FERROPLASMA_SOCKET", &store.socket)
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.starts_with("1000 bytes at 0x"), "{text}");
}
