"""``fastdeploy-mtp router``, the OpenAI front end of splitwise serving: the command
(:mod:`.server`) and its options (:mod:`.options`), its backend (:mod:`.backend`), what it
says to the prefill and decode instances (:mod:`.forwarding`) and how it waits for a full
decode instance (:mod:`.retry`)."""
