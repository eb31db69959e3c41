"""The boot tier: the rendered scripts in real Debian 12 guests (see tests/boot/conftest.py and
docs/guides/boot-tier.md). Per cloud (the ``cloud`` fixture, GCP then AWS) the scenarios run in
this order on one job's VMs; ``-k gcp`` or ``-k aws`` runs one cloud."""

from tests.boot import scenarios


def test_first_boot_formats_the_job_disk_and_starts_the_trainer(story, boot_record):
    scenarios.first_boot(story, boot_record)


def test_a_reboot_resumes_from_the_checkpoint_without_formatting(story, boot_record):
    scenarios.reboot(story, boot_record)


def test_a_preemption_saves_the_checkpoint_and_records_it_once(story, boot_record):
    scenarios.preemption(story, boot_record)


def test_the_next_attempt_resumes_and_a_normal_stop_is_recorded(story, boot_record):
    scenarios.normal_stop(story, boot_record)


def test_a_job_that_completes_is_recorded_once_and_not_run_again(completing, boot_record):
    scenarios.completion(completing, boot_record)
