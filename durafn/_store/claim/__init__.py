"""The claim: which due rows an executor takes, in what order, and how it marks them
(``statements`` is the driver's entry; ``take`` the full claim and its order; ``fast``
its one-statement path; ``queues`` and ``flow`` the named queues' and flow keys' parts;
``inline`` the rows a caller runs itself; ``batched`` batched actions, a batch at a
time; ``hints`` what one claim tells the next)."""
