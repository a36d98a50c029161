//! Lists that page (issue 38): every object that exists for the whole
//! listing comes exactly once, whatever is created and deleted meanwhile;
//! cursors that name no listing are refused; the unpaged `List` of older
//! clients is still answered.

mod common;

use common::TestStore;
use ferroplasma_client::ObjectId;
use ferroplasma_protocol::frame::{read_message, write_message};
use ferroplasma_protocol::pb::{self, reply, request};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};

fn fill(c: &ferroplasma_client::Client, n: usize) -> Vec<ObjectId> {
    (0..n)
        .map(|_| {
            let id = ObjectId::random();
            c.create_and_seal(id, b"x", b"").unwrap();
            id
        })
        .collect()
}

#[test]
fn a_paged_list_under_creates_and_deletes_has_each_lasting_object_exactly_once() {
    let store = TestStore::start("256MiB");
    let c = store.client();
    let lasting: HashSet<ObjectId> = fill(&c, 20_000).into_iter().collect();
    let doomed = fill(&c, 5_000);
    let deleted = AtomicUsize::new(0);
    let stop = AtomicBool::new(false);
    let mut seen: HashMap<ObjectId, usize> = HashMap::new();
    let created: HashSet<ObjectId> = std::thread::scope(|s| {
        // Another client deletes the doomed objects and creates others
        // while the listing runs: the table shrinks, grows and reorders.
        let churn = s.spawn(|| {
            let w = store.client();
            let mut created = Vec::new();
            for chunk in doomed.chunks(50) {
                w.delete(chunk).unwrap();
                deleted.fetch_add(chunk.len(), Ordering::SeqCst);
                created.extend(fill(&w, 100));
            }
            while !stop.load(Ordering::SeqCst) {
                created.extend(fill(&w, 100));
            }
            created
        });
        let mut pages = c.list_pages(300);
        for (i, page) in pages.by_ref().enumerate() {
            for o in page.unwrap() {
                *seen.entry(o.id).or_default() += 1;
            }
            if i == 0 {
                // Half the doomed go after the first page, half during the rest.
                while deleted.load(Ordering::SeqCst) < doomed.len() / 2 {
                    std::thread::yield_now();
                }
            }
        }
        stop.store(true, Ordering::SeqCst);
        churn.join().unwrap().into_iter().collect()
    });
    for (id, n) in &seen {
        assert_eq!(*n, 1, "{id} listed {n} times");
        assert!(
            lasting.contains(id) || doomed.contains(id),
            "{id} was not there at the start"
        );
    }
    let missing = lasting.iter().filter(|id| !seen.contains_key(id)).count();
    assert_eq!(
        missing, 0,
        "objects that lasted the whole listing are missing"
    );
    assert!(!created.is_empty() && created.iter().all(|id| !seen.contains_key(id)));
    let doomed_seen = doomed.iter().filter(|id| seen.contains_key(id)).count();
    assert!(
        doomed_seen < doomed.len(),
        "objects deleted before their page are skipped"
    );
}

#[test]
fn list_pages_reads_every_object_of_a_store_larger_than_its_first_page() {
    let store = TestStore::start("64MiB");
    let c = store.client();
    let ids: HashSet<ObjectId> = fill(&c, 2_500).into_iter().collect();
    let mut pages = c.list_pages(1_000);
    let first = pages.next().unwrap().unwrap();
    assert_eq!(pages.total(), Some(2_500));
    assert!(first.len() <= 1_000);
    let mut all: Vec<ObjectId> = first.into_iter().map(|o| o.id).collect();
    for page in pages {
        all.extend(page.unwrap().into_iter().map(|o| o.id));
    }
    assert_eq!(all.len(), 2_500);
    assert_eq!(all.into_iter().collect::<HashSet<_>>(), ids);
    let listed = c.list().unwrap();
    assert_eq!(listed.len(), 2_500);
    assert!(listed
        .iter()
        .all(|o| o.sealed && o.data_size == 1 && !o.spilled));
}

/// A connection speaking the protocol by hand (an older client's, or a
/// confused one's).
struct Raw(std::os::unix::net::UnixStream, u64);

impl Raw {
    fn connect(store: &TestStore) -> Self {
        let mut raw = Raw(
            std::os::unix::net::UnixStream::connect(store.path()).unwrap(),
            0,
        );
        let connect = request::Body::Connect(pb::Connect {
            protocol_version: ferroplasma_protocol::PROTOCOL_VERSION,
            client_name: "by hand".into(),
        });
        assert!(matches!(raw.call(connect), reply::Body::Connect(_)));
        raw
    }

    fn call(&mut self, body: request::Body) -> reply::Body {
        self.1 += 1;
        let req = pb::Request {
            request_id: self.1,
            body: Some(body),
        };
        write_message(&mut self.0, &req).unwrap();
        let r: pb::Reply =
            read_message(&mut self.0, ferroplasma_protocol::frame::MAX_REPLY_FRAME).unwrap();
        assert_eq!(r.request_id, self.1);
        r.body.unwrap()
    }

    fn list(&mut self, page_size: u32, cursor: u64) -> reply::Body {
        self.call(request::Body::List(pb::List {
            cluster: false,
            page_size,
            cursor,
        }))
    }
}

#[test]
fn cursors_of_no_open_listing_are_refused_and_the_unpaged_list_is_answered() {
    let store = TestStore::start("64MiB");
    fill(&store.client(), 30);
    let mut raw = Raw::connect(&store);
    let reply::Body::List(all) = raw.list(0, 0) else {
        panic!("an unpaged List is answered with a ListReply")
    };
    assert_eq!(all.objects.len(), 30);
    // Five listings started: the first is forgotten, the fifth goes on.
    let cursors: Vec<u64> = (0..5)
        .map(|_| match raw.list(10, 0) {
            reply::Body::ListPage(p) => {
                assert_eq!((p.total, p.flags.len(), p.object_ids.len()), (30, 10, 200));
                assert_ne!(p.next, 0);
                p.next
            }
            other => panic!("{other:?}"),
        })
        .collect();
    let refused = |b: reply::Body| match b {
        reply::Body::Error(e) => {
            assert_eq!(e.code, pb::ErrorCode::InvalidRequest as i32, "{e:?}");
            assert!(e.message.contains("start again with cursor 0"), "{e:?}");
        }
        other => panic!("not refused: {other:?}"),
    };
    refused(raw.list(10, cursors[0]));
    refused(raw.list(10, u64::MAX));
    let mut cursor = cursors[4];
    let mut rows = 10;
    while cursor != 0 {
        let reply::Body::ListPage(p) = raw.list(10, cursor) else {
            panic!("the fifth listing goes on")
        };
        rows += p.flags.len();
        cursor = p.next;
    }
    assert_eq!(rows, 30);
    // A listing read to its end is closed.
    refused(raw.list(10, cursors[4]));
}
