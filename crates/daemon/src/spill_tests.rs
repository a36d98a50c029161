use super::*;
use std::os::unix::fs::PermissionsExt;

fn parent(tag: &str) -> PathBuf {
    let p = std::env::temp_dir().join(format!(
        "fp-seg-{tag}-{}-{:x}",
        std::process::id(),
        random_u64()
    ));
    std::fs::create_dir_all(&p).unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o700)).unwrap();
    p
}

fn victims(arena: &Arena, at: u64, data: &[u8]) -> [SpillVictim; 1] {
    arena.write(at, data);
    [SpillVictim {
        id: ferroplasma_protocol::ObjectId::random(),
        offset: at,
        len: data.len() as u64,
    }]
}

#[test]
fn a_segment_written_without_a_flush_reads_back() {
    let parent = parent("rw");
    let dir = SpillDir::create(&parent).unwrap();
    let arena = Arena::create(1 << 20, None, false).unwrap();
    let data: Vec<u8> = (0..300_000u32).map(|i| (i * 7) as u8).collect();
    let v = victims(&arena, 4096, &data);
    let offsets = dir.write_segment(9, &arena, &v).unwrap();
    let meta = std::fs::metadata(dir.path().join("segment-9.spill")).unwrap();
    assert_eq!(meta.len(), data.len() as u64, "exactly the reserved length");
    let at = SpillRef {
        segment: 9,
        offset: offsets[0],
        len: data.len() as u64,
    };
    dir.read_into(at, &arena, 600_000).unwrap();
    assert_eq!(arena.bytes(600_000, data.len() as u64), &data[..]);
    drop(dir);
    let _ = std::fs::remove_dir_all(&parent);
}

#[test]
fn the_directory_and_its_segments_are_private_and_unpredictable() {
    let parent = parent("private");
    let (a, b) = (
        SpillDir::create(&parent).unwrap(),
        SpillDir::create(&parent).unwrap(),
    );
    assert_ne!(
        a.path(),
        b.path(),
        "two stores of one pid get different names"
    );
    let name = a.path().file_name().unwrap().to_string_lossy().into_owned();
    let guessable = format!("ferroplasma-spill-{}", std::process::id());
    assert!(name.len() >= guessable.len() + 16, "{name} is guessable");
    let mode = std::fs::metadata(a.path()).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o700, "directory mode {mode:o}");
    let arena = Arena::create(1 << 20, None, false).unwrap();
    a.write_segment(0, &arena, &victims(&arena, 0, b"secret"))
        .unwrap();
    let mode = std::fs::metadata(a.path().join("segment-0.spill"))
        .unwrap()
        .permissions()
        .mode();
    assert_eq!(mode & 0o777, 0o600, "segment mode {mode:o}");
    drop((a, b));
    let _ = std::fs::remove_dir_all(&parent);
}

#[test]
fn a_link_planted_in_the_directory_is_never_followed() {
    let parent = parent("link");
    let dir = SpillDir::create(&parent).unwrap();
    let victim = parent.join("victim-file");
    std::fs::write(&victim, b"the user's own file").unwrap();
    std::os::unix::fs::symlink(&victim, dir.path().join("segment-0.spill")).unwrap();
    let arena = Arena::create(1 << 20, None, false).unwrap();
    let v = victims(&arena, 0, b"spilled bytes");
    assert!(
        dir.write_segment(0, &arena, &v).is_err(),
        "wrote through a planted link"
    );
    assert_eq!(std::fs::read(&victim).unwrap(), b"the user's own file");
    let at = SpillRef {
        segment: 0,
        offset: 0,
        len: 13,
    };
    assert!(
        dir.read_into(at, &arena, 4096).is_err(),
        "read through a planted link"
    );
    drop(dir);
    let _ = std::fs::remove_dir_all(&parent);
}

#[test]
fn a_parent_others_can_write_is_refused_unless_sticky() {
    let parent = parent("open");
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o777)).unwrap();
    let e = SpillDir::create(&parent).unwrap_err().to_string();
    assert!(e.contains("writable by other users"), "{e}");
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o1777)).unwrap();
    SpillDir::create(&parent).expect("a sticky directory like /tmp is fine");
    let e = SpillDir::create(&parent.join("missing"))
        .unwrap_err()
        .to_string();
    assert!(e.contains("create the directory first"), "{e}");
    if nix::unistd::geteuid().is_root() {
        let theirs = parent.join("theirs");
        std::fs::create_dir(&theirs).unwrap();
        nix::unistd::chown(&theirs, Some(65534.into()), None).unwrap();
        let e = SpillDir::create(&theirs).unwrap_err().to_string();
        assert!(e.contains("belongs to uid 65534"), "{e}");
    }
    let _ = std::fs::remove_dir_all(&parent);
}

#[test]
fn a_removed_directory_fails_once_then_is_made_again() {
    let parent = parent("gone");
    let dir = SpillDir::create(&parent).unwrap();
    let arena = Arena::create(1 << 20, None, false).unwrap();
    let v = victims(&arena, 0, b"bytes");
    let old = dir.path();
    std::fs::remove_dir_all(&old).unwrap();
    assert!(dir.write_segment(1, &arena, &v).is_err());
    let why = dir
        .refusal()
        .expect("spills are refused right after a failure");
    assert!(why.contains(&old.display().to_string()), "{why}");
    assert!(dir.vanished(), "the removal is seen");
    assert!(!dir.vanished(), "and reported once");
    assert_ne!(dir.path(), old);
    assert!(
        dir.refusal().is_none(),
        "a new directory may be tried at once"
    );
    dir.write_segment(2, &arena, &v).unwrap();
    drop(dir);
    let _ = std::fs::remove_dir_all(&parent);
}

#[test]
fn a_removed_parent_is_reported_once_and_tried_again_at_most_once_a_second() {
    let parent = parent("parent-gone");
    let dir = SpillDir::create(&parent).unwrap();
    let before = dir.generation();
    std::fs::remove_dir_all(&parent).unwrap();
    assert!(dir.vanished(), "the removal is seen");
    assert_ne!(
        dir.generation(),
        before,
        "a spill under way will not be recorded"
    );
    let t = Instant::now();
    let mut tries = 0;
    while t.elapsed() < Duration::from_millis(300) {
        assert!(!dir.vanished(), "reported once");
        tries += 1;
    }
    assert!(tries > 100);
    assert!(dir.refusal().is_some(), "spills are refused meanwhile");
    // Its owner makes it again: within a second a new private directory
    // is made in it (its owner and mode checked again).
    std::fs::create_dir_all(&parent).unwrap();
    std::fs::set_permissions(&parent, std::fs::Permissions::from_mode(0o700)).unwrap();
    std::thread::sleep(RETRY_AFTER);
    assert!(!dir.vanished());
    assert!(dir.refusal().is_none());
    assert!(dir.path().starts_with(&parent) && dir.path().exists());
    let arena = Arena::create(1 << 20, None, false).unwrap();
    dir.write_segment(1, &arena, &victims(&arena, 0, b"bytes"))
        .unwrap();
    drop(dir);
    assert_eq!(
        std::fs::read_dir(&parent).unwrap().count(),
        0,
        "nothing left behind"
    );
    let _ = std::fs::remove_dir_all(&parent);
}
