"""The client's one transport session to the fleet: every Read stream and checkpoint call rides it.

    fleet.py         Fleet: the endpoints and their rotation, one Connection each, the RetryPolicy of
                     every call (discovery, Read streams, checkpoint calls); find_dataset
    channel.py       Connection: one server's control channel, discovery, the grant, its data plane's
                     Flight client; CHANNEL_OPTIONS and FLIGHT_OPTIONS, the one commented list of each
    retry.py         Attempts: failures in a row under a RetryPolicy (backoff, count and time budget)
    session.py       StreamSession: one Read stream resumed where it broke; CallRegistry
    flight_call.py   FlightCall: one Read stream as a Flight DoGet (the ReadCall the session reads)
    port_probe.py    what answers at host:port (`shardstream ping`, the wrong-port errors)

Above it (tests/test_layers.py): client/cursors/, client/checkpoint/ (a thin layer of calls over a
Fleet) and the reads (the Loader hands its Fleet's `open_read` to its prefetch thread).
"""
