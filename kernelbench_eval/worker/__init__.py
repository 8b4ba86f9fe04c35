"""The worker side: what runs inside a reference's or candidate's process."""
