//! Every example's NetFilter is valid for its service, and the user code
//! stays small.

use protoplane_inc_examples::harness::{code_lines, netfilter, registration, App};

#[test]
fn every_netfilter_fits_its_service() {
    for app in App::ALL {
        let f = netfilter(app).unwrap_or_else(|e| panic!("{}: {e}", app.name()));
        assert_eq!(f.app_name, app.name());
        let reg = registration(app, "x", 5).expect("registration");
        match app {
            App::SyncAgg => assert_eq!(reg.threshold, 5, "all members"),
            App::Agreement => assert_eq!(reg.threshold, 3, "a majority of 5"),
            _ => {}
        }
    }
}

#[test]
fn user_code_is_small() {
    for app in App::ALL {
        let n = code_lines(app.user_code());
        assert!(n > 5 && n < 60, "{}: {n} lines", app.name());
    }
}
