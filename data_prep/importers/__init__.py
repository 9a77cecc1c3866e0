"""Turn a folder of photos and a captions file into a Karpathy-split JSON file; or several captions
files, each with its folder, into one (:func:`~data_prep.importers.dataset.image_root`: COCO's
train2017 and val2017 captions and folders become one dataset whose paths are
``train2017/NAME.jpg`` and ``val2017/NAME.jpg``). An image, or a COCO id, that an earlier
captions file gave is a ``duplicate_entry`` of the later one.

The result is read unchanged by :func:`data_prep.karpathy.load_karpathy` (and so by
``captioner prepare-features`` and ``captioner fit``). Image names are paths relative to the
image folder, written with ``/``.

Captions files (the reader is chosen by :func:`~data_prep.importers.formats.detect_format`, or
explicitly):

* ``jsonl``: one object per line, ``{"image": "relative/path.jpg", "captions": ["...", ...]}``
  (other keys are ignored; blank lines are allowed);
* ``json``: a JSON array of the same objects;
* ``csv`` / ``tsv``: a header line naming the columns ``image`` and ``caption`` (other columns
  are ignored), then one caption per line; an image has as many lines as captions. CSV fields
  follow the usual quoting (Flickr8k's ``captions.txt``: captions holding commas are quoted);
  TSV fields are taken literally, without quoting;
* ``coco``: a COCO captions file (``captions_train2014.json``): ``images`` with ``id`` and
  ``file_name``, ``annotations`` with ``image_id`` and ``caption``; the ids are kept as
  ``cocoid``, so results can be scored against the same file.

A second record for the same image (a JSONL line or a COCO image repeating a path, a COCO id
used twice) is a ``duplicate_entry``: the first record is kept and the later one is skipped,
never merged, because a file concatenated twice would otherwise double every caption. (CSV and
TSV files list an image once per caption by design.) A caption of an image with the same
tokens as an earlier caption of that image is a ``duplicate_caption``, skipped for the same
reason: it would weigh twice in training and in the references of the scores. Two paths with
the same file name in different folders are different images.

A CSV quote left open (``a.jpg,"A dog``) makes the csv module read on over the line ends, up to
the next quote or the end of the file, and so would swallow the captions of the lines after it.
A record read over several lines is therefore kept only when it is well formed (a quoted
caption holding a line break); otherwise its first line is reported as an unclosed quote and
the lines after it are read again as records of their own.

Every problem is reported under one of the reasons in
:data:`~data_prep.importers.records.REASONS`, with its place in the captions file. With
``on_error="skip"`` the bad record, caption or image is left out and listed in the
:class:`~data_prep.importers.dataset.ImportReport`; with ``on_error="fail"``
:class:`~data_prep.importers.records.DatasetImportError` is raised once the captions file has
been read, naming its first problem in file order and the places of the others, before any image
is decoded; then at the first missing or unreadable image. Problems with the input as a whole
(unreadable or non-UTF-8 captions file, missing CSV header, invalid ``--split``, an empty split)
always raise."""
