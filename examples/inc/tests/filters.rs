//! Every example's NetFilter is valid for its service, and the user code
//! stays small.

use protoplane_inc_examples::check::PRECISION;
use protoplane_inc_examples::harness::{code_lines, netfilter, registration, App};

#[test]
fn every_netfilter_fits_its_service() {
    for app in App::ALL {
        let f = netfilter(app).unwrap_or_else(|e| panic!("{}: {e}", app.name()));
        assert_eq!(f.app_name, app.name());
        let reg = registration(app, "x", 5).expect("registration");
        match app {
            App::SyncAgg => {
                assert_eq!(reg.threshold, 5, "all members");
                assert_eq!(f.precision, Some(PRECISION), "the check quantizes like the filter");
            }
            App::Agreement => assert_eq!(reg.threshold, 3, "a majority of 5"),
            _ => {}
        }
    }
}

#[test]
fn user_code_is_small() {
    for app in App::ALL {
        let n = code_lines(app.user_code());
        // A server trait implementation and client functions written with
        // the generated builders and views.
        assert!(n > 5 && n < 100, "{}: {n} lines", app.name());
    }
}
