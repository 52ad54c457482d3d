// Which worker failures a migration mends: the policy the router's flights
// apply when a worker call ends in error.
//
// Migratable: the worker is gone or gave the request up for reasons of its
// own, not the request's:
//  - UNAVAILABLE: the connection broke or was refused (the process died or
//    stopped: keepalive), the worker is shutting down or draining;
//  - ABORTED: the worker lost the request's KV (a transfer to a dead peer,
//    a reservation gone, a role change cut short);
//  - a stall the router's watchdog noticed.
// Never: the client's own cancellation or deadline, bad input, a full KV
// cache (the request waits for room instead), or anything else a second
// worker would answer alike.

#ifndef TRIDENT_SERVICES_ROUTER_MIGRATION_H_
#define TRIDENT_SERVICES_ROUTER_MIGRATION_H_

#include "absl/status/status.h"

namespace trident::router {

bool IsMigratable(absl::StatusCode code);

}  // namespace trident::router

#endif  // TRIDENT_SERVICES_ROUTER_MIGRATION_H_
